/*
 * mlcpipe: growable ring buffer of bytes (used by TVM's RPC endpoint) for building TVM's web
 * runtime from the wheel's sources. Written for mlcpipe (the apache-tvm wheel does not ship this
 * header).
 */
#ifndef TVM_SUPPORT_RING_BUFFER_H_
#define TVM_SUPPORT_RING_BUFFER_H_

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace tvm {
namespace support {

class RingBuffer {
 public:
  RingBuffer() : ring_(kInitCapacity) {}

  /*! \brief Bytes stored and not yet read. */
  size_t bytes_available() const { return size_; }
  size_t capacity() const { return ring_.size(); }

  /*! \brief Make room for at least n stored bytes (keeps the stored ones). */
  void Reserve(size_t n) {
    if (n <= ring_.size()) return;
    size_t cap = std::max(ring_.size() * 2, n);
    std::vector<char> grown(cap);
    CopyOut(grown.data(), size_);
    ring_.swap(grown);
    head_ = 0;
  }

  /*! \brief Take `size` stored bytes (there must be that many). */
  void Read(void* data, size_t size) {
    TVM_FFI_ICHECK_LE(size, size_) << "RingBuffer: read past the stored bytes";
    CopyOut(static_cast<char*>(data), size);
    Consume(size);
  }

  /*!
   * \brief Hand up to max_nbytes stored bytes (one contiguous piece) to fsend(ptr, n), which
   *  returns how many it took. \return that number.
   */
  template <typename FSend>
  size_t ReadWithCallback(FSend fsend, size_t max_nbytes) {
    size_t n = std::min({max_nbytes, size_, ring_.size() - head_});
    if (n == 0) return 0;
    size_t taken = fsend(ring_.data() + head_, n);
    TVM_FFI_ICHECK_LE(taken, n);
    Consume(taken);
    return taken;
  }

  /*! \brief Store `size` bytes. */
  void Write(const void* data, size_t size) {
    Reserve(size_ + size);
    const char* src = static_cast<const char*>(data);
    size_t tail = (head_ + size_) % ring_.size();
    size_t first = std::min(size, ring_.size() - tail);
    std::memcpy(ring_.data() + tail, src, first);
    std::memcpy(ring_.data(), src + first, size - first);
    size_ += size;
  }

  /*!
   * \brief Let frecv(ptr, n) fill up to max_nbytes (one contiguous piece); it returns how many
   *  bytes it wrote. \return that number.
   */
  template <typename FRecv>
  size_t WriteWithCallback(FRecv frecv, size_t max_nbytes) {
    Reserve(size_ + max_nbytes);
    size_t tail = (head_ + size_) % ring_.size();
    size_t n = std::min(max_nbytes, ring_.size() - tail);
    if (n == 0) return 0;
    size_t got = frecv(ring_.data() + tail, n);
    TVM_FFI_ICHECK_LE(got, n);
    size_ += got;
    return got;
  }

 private:
  static constexpr size_t kInitCapacity = 4096;

  void CopyOut(char* dst, size_t size) const {
    if (size == 0) return;
    size_t first = std::min(size, ring_.size() - head_);
    std::memcpy(dst, ring_.data() + head_, first);
    std::memcpy(dst + first, ring_.data(), size - first);
  }
  void Consume(size_t size) {
    head_ = (head_ + size) % ring_.size();
    size_ -= size;
    if (size_ == 0) head_ = 0;
  }

  std::vector<char> ring_;
  size_t head_{0};
  size_t size_{0};
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_RING_BUFFER_H_
