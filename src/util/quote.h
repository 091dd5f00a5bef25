// How messages name a tensor, key or file name: in backquotes, `name`. The one home of that spelling.
#ifndef SAFETENSORS_SRC_UTIL_QUOTE_H_
#define SAFETENSORS_SRC_UTIL_QUOTE_H_

#include <string>
#include <string_view>

namespace safetensors::internal {

inline std::string quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('`');
  out.append(s);
  out.push_back('`');
  return out;
}

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_UTIL_QUOTE_H_
