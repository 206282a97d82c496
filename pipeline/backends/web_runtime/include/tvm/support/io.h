/*
 * mlcpipe: minimal byte-stream interface for building TVM's web runtime from the wheel's sources.
 * Written for mlcpipe (the apache-tvm wheel does not ship this header).
 */
#ifndef TVM_SUPPORT_IO_H_
#define TVM_SUPPORT_IO_H_

#include <cstddef>
#include <cstdint>

namespace tvm {
namespace support {

template <typename T, typename Enable>
struct Serializer;

/*! \brief A byte stream; typed reads and writes go through Serializer<T>. */
class Stream {
 public:
  virtual ~Stream() = default;
  /*! \brief Read up to `size` bytes into `ptr`; returns the number of bytes read. */
  virtual size_t Read(void* ptr, size_t size) = 0;
  /*! \brief Write `size` bytes from `ptr`; returns the number of bytes written. */
  virtual size_t Write(const void* ptr, size_t size) = 0;

  /*! \brief Read one value; false when the stream ran out or the data is malformed. */
  template <typename T>
  bool Read(T* out);
  /*! \brief Write one value. */
  template <typename T>
  void Write(const T& value);
  /*! \brief Read `n` consecutive values. */
  template <typename T>
  bool ReadArray(T* data, size_t n);
  /*! \brief Write `n` consecutive values. */
  template <typename T>
  void WriteArray(const T* data, size_t n);
};

}  // namespace support
}  // namespace tvm

#include <tvm/support/serializer.h>

#endif  // TVM_SUPPORT_IO_H_
