// Path arithmetic on '/'-separated strings, the one home of the library's rules for it (no filesystem access).
#ifndef SAFETENSORS_SRC_UTIL_PATH_H_
#define SAFETENSORS_SRC_UTIL_PATH_H_

#include <string>
#include <string_view>

namespace safetensors::internal {

// The directory holding `path`, as POSIX dirname(3) gives it for paths without trailing slashes:
// "a/b/c" -> "a/b", "/c" -> "/", "c" -> "." (so the result can always be opened).
inline std::string dirname_of(std::string_view path) {
  const auto slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

// The last component of `path`: "a/b/c" -> "c", "c" -> "c".
inline std::string basename_of(std::string_view path) {
  const auto slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

// `name` inside directory `dir`: "d" + "n" -> "d/n", "d/" + "n" -> "d/n"; an empty `dir` gives `name` itself.
inline std::string join_path(std::string_view dir, std::string_view name) {
  std::string out(dir);
  if (!out.empty() && out.back() != '/') out.push_back('/');
  out.append(name);
  return out;
}

// `name` in the directory of `path`, spelled as `path` spells it: "a/b/c" -> "a/b/NAME", "/c" -> "/NAME",
// "c" -> "NAME" (the same file as dirname_of(path) + "/NAME", without a "./" the caller did not write).
inline std::string sibling_path(std::string_view path, std::string_view name) {
  const auto slash = path.rfind('/');
  return join_path(slash == std::string_view::npos ? std::string_view() : path.substr(0, slash + 1), name);
}

}  // namespace safetensors::internal

#endif  // SAFETENSORS_SRC_UTIL_PATH_H_
