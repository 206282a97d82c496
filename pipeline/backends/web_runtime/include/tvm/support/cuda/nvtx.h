/*
 * mlcpipe: no-op NVTX range for building TVM's web runtime (there is no NVTX on the web).
 * Written for mlcpipe (the apache-tvm wheel does not ship this header).
 */
#ifndef TVM_SUPPORT_CUDA_NVTX_H_
#define TVM_SUPPORT_CUDA_NVTX_H_

#include <string>

namespace tvm {
namespace support {

/*! \brief Marks a profiling range for NVIDIA tools; does nothing here. */
class NVTXScopedRange {
 public:
  explicit NVTXScopedRange(const char* name) { (void)name; }
  explicit NVTXScopedRange(const std::string& name) { (void)name; }
  NVTXScopedRange(const NVTXScopedRange&) = delete;
  NVTXScopedRange& operator=(const NVTXScopedRange&) = delete;
};

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_CUDA_NVTX_H_
