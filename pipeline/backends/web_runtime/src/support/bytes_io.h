/*
 * mlcpipe: in-memory byte streams for building TVM's web runtime from the wheel's sources.
 * Written for mlcpipe (the apache-tvm wheel does not ship this header).
 */
#ifndef TVM_SUPPORT_BYTES_IO_H_
#define TVM_SUPPORT_BYTES_IO_H_

#include <tvm/ffi/error.h>
#include <tvm/ffi/string.h>
#include <tvm/support/io.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace tvm {
namespace support {

/*!
 * \brief Reads from a byte buffer. Built from an ffi::Bytes it holds a reference to it;
 *  built from a std::string the string must outlive the stream.
 */
class BytesInStream : public Stream {
 public:
  using Stream::Read;
  using Stream::Write;

  explicit BytesInStream(const ffi::Bytes& bytes)
      : owner_(bytes), data_(bytes.data()), size_(bytes.size()) {}
  explicit BytesInStream(const std::string& bytes) : data_(bytes.data()), size_(bytes.size()) {}
  BytesInStream(const void* data, size_t size)
      : data_(static_cast<const char*>(data)), size_(size) {}

  size_t Read(void* ptr, size_t size) final {
    size_t n = std::min(size, size_ - pos_);
    if (n != 0) std::memcpy(ptr, data_ + pos_, n);
    pos_ += n;
    return n;
  }
  size_t Write(const void*, size_t) final {
    TVM_FFI_THROW(InternalError) << "BytesInStream is read-only";
    return 0;
  }
  /*! \brief Bytes not read yet. */
  size_t remaining() const { return size_ - pos_; }

 private:
  ffi::Optional<ffi::Bytes> owner_;
  const char* data_;
  size_t size_;
  size_t pos_{0};
};

/*! \brief Appends everything written to a std::string (which must outlive the stream). */
class BytesOutStream : public Stream {
 public:
  using Stream::Read;
  using Stream::Write;

  explicit BytesOutStream(std::string* out) : out_(out) {}

  size_t Read(void*, size_t) final {
    TVM_FFI_THROW(InternalError) << "BytesOutStream is write-only";
    return 0;
  }
  size_t Write(const void* ptr, size_t size) final {
    out_->append(static_cast<const char*>(ptr), size);
    return size;
  }

 private:
  std::string* out_;
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_BYTES_IO_H_
