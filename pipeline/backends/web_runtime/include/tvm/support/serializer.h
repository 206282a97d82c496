/*
 * mlcpipe: minimal value serializer for building TVM's web runtime from the wheel's sources.
 * Written for mlcpipe (the apache-tvm wheel does not ship this header).
 *
 * Layout (must match what libtvm writes on the Python side):
 *   trivially copyable values (ints, floats, enums, DLDataType, DLDevice): raw little-endian bytes
 *   strings: uint64 length, then the bytes
 *   sequences (std::vector, ffi::Array): uint64 count, then each element
 *   maps (std::map, std::unordered_map, ffi::Map): uint64 count, then key, value, key, value, ...
 *   std::pair: first, then second
 */
#ifndef TVM_SUPPORT_SERIALIZER_H_
#define TVM_SUPPORT_SERIALIZER_H_

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/endian.h>
#include <tvm/ffi/string.h>
#include <tvm/support/io.h>

#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

static_assert(TVM_FFI_IO_NO_ENDIAN_SWAP, "mlcpipe's web runtime serializer assumes little endian");

namespace tvm {
namespace support {

namespace detail {
template <typename T>
struct IsPair : std::false_type {};
template <typename A, typename B>
struct IsPair<std::pair<A, B>> : std::true_type {};

template <typename T>
constexpr bool kRawBytes = std::is_trivially_copyable<T>::value && !IsPair<T>::value;

inline bool ReadCount(Stream* strm, uint64_t* count) {
  return strm->Read(count, sizeof(uint64_t)) == sizeof(uint64_t);
}
inline void WriteCount(Stream* strm, uint64_t count) { strm->Write(&count, sizeof(uint64_t)); }
}  // namespace detail

/*! \brief Primary template: types without a serializer. */
template <typename T, typename Enable = void>
struct Serializer {
  static constexpr bool enabled = false;
};

/*! \brief Trivially copyable values: their bytes. */
template <typename T>
struct Serializer<T, std::enable_if_t<detail::kRawBytes<T>>> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const T& value) { strm->Write(&value, sizeof(T)); }
  static bool Read(Stream* strm, T* value) { return strm->Read(value, sizeof(T)) == sizeof(T); }
};

template <>
struct Serializer<std::string> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const std::string& value) {
    detail::WriteCount(strm, value.size());
    if (!value.empty()) strm->Write(value.data(), value.size());
  }
  static bool Read(Stream* strm, std::string* value) {
    uint64_t size;
    if (!detail::ReadCount(strm, &size)) return false;
    value->resize(static_cast<size_t>(size));
    if (size == 0) return true;
    return strm->Read(&(*value)[0], value->size()) == value->size();
  }
};

template <>
struct Serializer<ffi::String> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const ffi::String& value) {
    detail::WriteCount(strm, value.size());
    if (value.size() != 0) strm->Write(value.data(), value.size());
  }
  static bool Read(Stream* strm, ffi::String* value) {
    std::string tmp;
    if (!Serializer<std::string>::Read(strm, &tmp)) return false;
    *value = ffi::String(std::move(tmp));
    return true;
  }
};

template <typename A, typename B>
struct Serializer<std::pair<A, B>> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const std::pair<A, B>& value) {
    Serializer<A>::Write(strm, value.first);
    Serializer<B>::Write(strm, value.second);
  }
  static bool Read(Stream* strm, std::pair<A, B>* value) {
    return Serializer<A>::Read(strm, &value->first) && Serializer<B>::Read(strm, &value->second);
  }
};

template <typename T, typename Alloc>
struct Serializer<std::vector<T, Alloc>> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const std::vector<T, Alloc>& value) {
    detail::WriteCount(strm, value.size());
    if constexpr (detail::kRawBytes<T>) {
      if (!value.empty()) strm->Write(value.data(), value.size() * sizeof(T));
    } else {
      for (const T& item : value) Serializer<T>::Write(strm, item);
    }
  }
  static bool Read(Stream* strm, std::vector<T, Alloc>* value) {
    uint64_t size;
    if (!detail::ReadCount(strm, &size)) return false;
    value->clear();
    value->resize(static_cast<size_t>(size));
    if constexpr (detail::kRawBytes<T>) {
      if (size == 0) return true;
      size_t nbytes = value->size() * sizeof(T);
      return strm->Read(value->data(), nbytes) == nbytes;
    } else {
      for (T& item : *value) {
        if (!Serializer<T>::Read(strm, &item)) return false;
      }
      return true;
    }
  }
};

namespace detail {
/*! \brief Maps of the standard library: count, then key/value pairs. */
template <typename MapType>
struct StdMapSerializer {
  using K = typename MapType::key_type;
  using V = typename MapType::mapped_type;
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const MapType& value) {
    WriteCount(strm, value.size());
    for (const auto& kv : value) {
      Serializer<K>::Write(strm, kv.first);
      Serializer<V>::Write(strm, kv.second);
    }
  }
  static bool Read(Stream* strm, MapType* value) {
    uint64_t size;
    if (!ReadCount(strm, &size)) return false;
    value->clear();
    for (uint64_t i = 0; i < size; ++i) {
      K key;
      V val;
      if (!Serializer<K>::Read(strm, &key) || !Serializer<V>::Read(strm, &val)) return false;
      (*value)[std::move(key)] = std::move(val);
    }
    return true;
  }
};
}  // namespace detail

template <typename K, typename V, typename C, typename A>
struct Serializer<std::map<K, V, C, A>> : detail::StdMapSerializer<std::map<K, V, C, A>> {};

template <typename K, typename V, typename H, typename E, typename A>
struct Serializer<std::unordered_map<K, V, H, E, A>>
    : detail::StdMapSerializer<std::unordered_map<K, V, H, E, A>> {};

template <typename T>
struct Serializer<ffi::Array<T>> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const ffi::Array<T>& value) {
    detail::WriteCount(strm, value.size());
    for (size_t i = 0; i < value.size(); ++i) {
      T item = value[i];
      Serializer<T>::Write(strm, item);
    }
  }
  static bool Read(Stream* strm, ffi::Array<T>* value) {
    uint64_t size;
    if (!detail::ReadCount(strm, &size)) return false;
    ffi::Array<T> out;
    for (uint64_t i = 0; i < size; ++i) {
      T item;
      if (!Serializer<T>::Read(strm, &item)) return false;
      out.push_back(std::move(item));
    }
    *value = std::move(out);
    return true;
  }
};

template <typename K, typename V>
struct Serializer<ffi::Map<K, V>> {
  static constexpr bool enabled = true;
  static void Write(Stream* strm, const ffi::Map<K, V>& value) {
    detail::WriteCount(strm, value.size());
    for (const auto& kv : value) {
      Serializer<K>::Write(strm, kv.first);
      Serializer<V>::Write(strm, kv.second);
    }
  }
  static bool Read(Stream* strm, ffi::Map<K, V>* value) {
    uint64_t size;
    if (!detail::ReadCount(strm, &size)) return false;
    ffi::Map<K, V> out;
    for (uint64_t i = 0; i < size; ++i) {
      K key;
      V val;
      if (!Serializer<K>::Read(strm, &key) || !Serializer<V>::Read(strm, &val)) return false;
      out.Set(key, val);
    }
    *value = std::move(out);
    return true;
  }
};

// ---- Stream's typed members ----
template <typename T>
inline bool Stream::Read(T* out) {
  return Serializer<T>::Read(this, out);
}

template <typename T>
inline void Stream::Write(const T& value) {
  Serializer<T>::Write(this, value);
}

template <typename T>
inline bool Stream::ReadArray(T* data, size_t n) {
  if constexpr (detail::kRawBytes<T>) {
    size_t nbytes = n * sizeof(T);
    return nbytes == 0 || this->Read(static_cast<void*>(data), nbytes) == nbytes;
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (!Serializer<T>::Read(this, data + i)) return false;
    }
    return true;
  }
}

template <typename T>
inline void Stream::WriteArray(const T* data, size_t n) {
  if constexpr (detail::kRawBytes<T>) {
    if (n != 0) this->Write(static_cast<const void*>(data), n * sizeof(T));
  } else {
    for (size_t i = 0; i < n; ++i) Serializer<T>::Write(this, data[i]);
  }
}

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_SERIALIZER_H_
