/*
 * mlcpipe: small string helpers for building TVM's web runtime from the wheel's sources.
 * Written for mlcpipe (the apache-tvm wheel does not ship this header).
 */
#ifndef TVM_SUPPORT_UTILS_H_
#define TVM_SUPPORT_UTILS_H_

#include <string>
#include <vector>

namespace tvm {
namespace support {

inline bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

inline bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/*! \brief Pieces of s between occurrences of delim (empty pieces kept). */
inline std::vector<std::string> Split(const std::string& s, char delim) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t at = s.find(delim, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_UTILS_H_
