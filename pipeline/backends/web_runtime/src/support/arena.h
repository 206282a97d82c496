/*
 * mlcpipe: bump-pointer arena (used by TVM's RPC endpoint for per-call scratch memory) for
 * building TVM's web runtime from the wheel's sources. Written for mlcpipe (the apache-tvm wheel
 * does not ship this header).
 */
#ifndef TVM_SUPPORT_ARENA_H_
#define TVM_SUPPORT_ARENA_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace tvm {
namespace support {

/*! \brief Hands out memory from big pages; everything is given back at once by RecycleAll. */
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  /*! \brief Uninitialised room for `count` objects of trivial type T. */
  template <typename T>
  T* allocate_(int count) {
    return static_cast<T*>(Alloc(sizeof(T) * static_cast<size_t>(std::max(count, 0)), alignof(T)));
  }
  /*! \brief Construct a T in the arena (its destructor is never run). */
  template <typename T, typename... Args>
  T* make(Args&&... args) {
    return new (Alloc(sizeof(T), alignof(T))) T(std::forward<Args>(args)...);
  }
  /*! \brief Raw aligned memory. */
  void* Alloc(size_t size, size_t align = alignof(std::max_align_t)) {
    for (;;) {
      if (current_ < pages_.size()) {
        Page& page = pages_[current_];
        uintptr_t base = reinterpret_cast<uintptr_t>(page.data.get());
        uintptr_t at = (base + offset_ + align - 1) / align * align;
        if (at + size <= base + page.size) {
          offset_ = at + size - base;
          return reinterpret_cast<void*>(at);
        }
        ++current_;
        offset_ = 0;
        continue;
      }
      size_t bytes = std::max(kPageSize, size + align);
      pages_.push_back(Page{std::unique_ptr<char[]>(new char[bytes]), bytes});
    }
  }
  /*! \brief Forget every allocation; the pages are reused. */
  void RecycleAll() {
    current_ = 0;
    offset_ = 0;
  }

 private:
  static constexpr size_t kPageSize = 16 << 10;
  struct Page {
    std::unique_ptr<char[]> data;
    size_t size;
  };
  std::vector<Page> pages_;
  size_t current_{0};
  size_t offset_{0};
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_ARENA_H_
