/*
 * mlcpipe: base64 encoding / decoding streams (RFC 4648 alphabet, '=' padding) for building
 * TVM's web runtime from the wheel's sources. Written for mlcpipe (the apache-tvm wheel does not
 * ship this header).
 */
#ifndef TVM_SUPPORT_BASE64_H_
#define TVM_SUPPORT_BASE64_H_

#include <tvm/ffi/error.h>
#include <tvm/support/io.h>

#include <cstdint>
#include <cstring>

namespace tvm {
namespace support {

namespace base64 {
inline char EncodeChar(uint32_t v) {
  static const char* kTable = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  return kTable[v & 63];
}
/*! \return the 6-bit value of c, -1 for padding '=', -2 for anything else. */
inline int DecodeChar(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  if (c == '=') return -1;
  return -2;
}
inline bool IsSpace(int c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
}  // namespace base64

/*! \brief Decodes base64 text read from another stream. Call InitPosition() first. */
class Base64InStream : public Stream {
 public:
  using Stream::Read;
  using Stream::Write;

  explicit Base64InStream(Stream* in) : in_(in) {}

  /*! \brief Skip leading whitespace. */
  void InitPosition() {
    do {
      peek_ = NextRawChar();
    } while (peek_ != -1 && base64::IsSpace(peek_));
  }

  size_t Read(void* ptr, size_t size) final {
    uint8_t* out = static_cast<uint8_t*>(ptr);
    size_t n = 0;
    while (n < size) {
      if (avail_ == 0 && !DecodeQuantum()) break;
      out[n++] = buf_[3 - avail_];
      --avail_;
    }
    return n;
  }
  size_t Write(const void*, size_t) final {
    TVM_FFI_THROW(InternalError) << "Base64InStream is read-only";
    return 0;
  }

 private:
  int NextRawChar() {
    char c;
    return in_->Read(&c, 1) == 1 ? static_cast<unsigned char>(c) : -1;
  }
  int NextChar() {
    if (peek_ != -2) {
      int c = peek_;
      peek_ = -2;
      return c;
    }
    return NextRawChar();
  }
  // Decode four characters into up to three bytes, right-aligned in buf_.
  bool DecodeQuantum() {
    if (finished_) return false;
    int vals[4];
    int count = 0;
    while (count < 4) {
      int c = NextChar();
      if (c == -1) break;
      if (base64::IsSpace(c)) continue;
      int v = base64::DecodeChar(c);
      TVM_FFI_ICHECK(v != -2) << "invalid base64 character " << c;
      vals[count++] = v;
    }
    if (count == 0) {
      finished_ = true;
      return false;
    }
    TVM_FFI_ICHECK(count == 4 && vals[0] >= 0 && vals[1] >= 0) << "truncated base64 input";
    uint32_t word = (static_cast<uint32_t>(vals[0]) << 18) | (static_cast<uint32_t>(vals[1]) << 12);
    int nbytes = 1;
    if (vals[2] >= 0) {
      word |= static_cast<uint32_t>(vals[2]) << 6;
      nbytes = 2;
      if (vals[3] >= 0) {
        word |= static_cast<uint32_t>(vals[3]);
        nbytes = 3;
      }
    }
    if (nbytes < 3) finished_ = true;
    uint8_t all[3] = {static_cast<uint8_t>(word >> 16), static_cast<uint8_t>(word >> 8),
                      static_cast<uint8_t>(word)};
    for (int i = 0; i < nbytes; ++i) buf_[3 - nbytes + i] = all[i];
    avail_ = nbytes;
    return true;
  }

  Stream* in_;
  int peek_{-2};  // -2: no peeked character
  uint8_t buf_[3];
  int avail_{0};
  bool finished_{false};
};

/*! \brief Encodes what is written as base64 text into another stream. Call Finish() last. */
class Base64OutStream : public Stream {
 public:
  using Stream::Read;
  using Stream::Write;

  explicit Base64OutStream(Stream* out) : out_(out) {}

  size_t Write(const void* ptr, size_t size) final {
    const uint8_t* in = static_cast<const uint8_t*>(ptr);
    for (size_t i = 0; i < size; ++i) {
      pending_[npending_++] = in[i];
      if (npending_ == 3) Flush();
    }
    return size;
  }
  size_t Read(void*, size_t) final {
    TVM_FFI_THROW(InternalError) << "Base64OutStream is write-only";
    return 0;
  }
  /*! \brief Write out the last partial group with padding. */
  void Finish() {
    if (npending_ != 0) Flush();
  }

 private:
  void Flush() {
    uint32_t word = static_cast<uint32_t>(pending_[0]) << 16;
    if (npending_ > 1) word |= static_cast<uint32_t>(pending_[1]) << 8;
    if (npending_ > 2) word |= static_cast<uint32_t>(pending_[2]);
    char text[4] = {base64::EncodeChar(word >> 18), base64::EncodeChar(word >> 12),
                    npending_ > 1 ? base64::EncodeChar(word >> 6) : '=',
                    npending_ > 2 ? base64::EncodeChar(word) : '='};
    out_->Write(text, 4);
    npending_ = 0;
  }

  Stream* out_;
  uint8_t pending_[3];
  int npending_{0};
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_BASE64_H_
