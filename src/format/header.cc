#include "format/header.h"

#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <unordered_set>

#include "util/checked.h"
#include "util/quote.h"
#include "util/thread_cache.h"

namespace safetensors::internal {
namespace {

static_assert(kJsonPadding >= simdjson::SIMDJSON_PADDING, "padding must satisfy simdjson");

// Headers up to this size are read into, and parsed by, buffers that each thread keeps for its next open,
// so opening many files does not allocate and page-fault them afresh each time; a rare huge header gets
// buffers of its own, freed with it, so no thread keeps hundreds of MB.
constexpr std::size_t kReusedLimit = 8u << 20;

// `size` writable bytes for the header read: this thread's reused buffer, or *own for a huge header.
char* header_buffer(std::size_t size, std::unique_ptr<char[]>* own) {
  if (size > kReusedLimit + kJsonPadding) {
    *own = std::make_unique_for_overwrite<char[]>(size);
    return own->get();
  }
  struct Reused {
    std::unique_ptr<char[]> buffer;
    std::size_t capacity = 0;
  };
  static ThreadCache<Reused> cache;
  Reused& reused = cache.get();
  if (reused.capacity < size) {
    reused.buffer = std::make_unique_for_overwrite<char[]>(size);
    reused.capacity = size;
  }
  return reused.buffer.get();
}

using simdjson::dom::element;
using simdjson::dom::element_type;

std::string type_name(element_type t) {
  switch (t) {
    case element_type::ARRAY: return "an array";
    case element_type::OBJECT: return "an object";
    case element_type::INT64:
    case element_type::UINT64: return "an integer";
    case element_type::DOUBLE: return "a floating-point number";
    case element_type::STRING: return "a string";
    case element_type::BOOL: return "a boolean";
    case element_type::NULL_VALUE: return "null";
  }
  return "a value";
}

// Reads a non-negative integer that fits in 64 bits. JSON numbers with a fraction or exponent are refused
// even when integral, as the reference does.
bool get_u64(element e, std::uint64_t* out) {
  if (e.type() != element_type::INT64 && e.type() != element_type::UINT64) return false;
  return e.get_uint64().get(*out) == simdjson::SUCCESS;
}

// The reference's JSON reader (serde_json) refuses more than 127 nested arrays and objects; simdjson allows
// 1024. Only values the schema ignores can nest that deep without failing a type check, so they are measured.
// A tensor entry is the second level, leaving this many for a value inside it.
constexpr int kMaxIgnoredNesting = 127 - 2;

// True when `value` holds more than `levels` levels of nested arrays and objects. The recursion is bounded by
// simdjson's own depth limit.
bool nested_deeper_than(element value, int levels) {
  if (value.type() == element_type::ARRAY) {
    if (levels == 0) return true;
    for (element child : simdjson::dom::array(value)) {
      if (nested_deeper_than(child, levels - 1)) return true;
    }
  } else if (value.type() == element_type::OBJECT) {
    if (levels == 0) return true;
    for (auto kv : simdjson::dom::object(value)) {
      if (nested_deeper_than(kv.value, levels - 1)) return true;
    }
  }
  return false;
}

// serde_json reads the integer literal -0 as the float -0.0, so the reference refuses it wherever an integer
// is required and ignores it elsewhere; simdjson reads it as the integer 0. Returns `json` with every -0
// literal outside strings spelled -0.0, which gives the reference's decision everywhere, followed by
// kJsonPadding zero bytes; or nullptr when there is none (the common case: one search, or one scan when a
// name contains "-0").
std::unique_ptr<char[]> respell_negative_zero(std::string_view json, std::size_t* size) {
  if (json.find("-0") == std::string_view::npos) return nullptr;
  std::vector<std::size_t> zeros;  // positions of the '0' of each -0 literal
  bool in_string = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '-' && i + 1 < json.size() && json[i + 1] == '0') {
      const char next = i + 2 < json.size() ? json[i + 2] : ' ';
      if (!(next >= '0' && next <= '9') && next != '.' && next != 'e' && next != 'E') zeros.push_back(i + 1);
    }
  }
  if (zeros.empty()) return nullptr;
  *size = json.size() + 2 * zeros.size();
  auto buf = std::make_unique<char[]>(*size + kJsonPadding);
  char* out = buf.get();
  std::size_t from = 0;
  for (std::size_t z : zeros) {
    std::memcpy(out, json.data() + from, z + 1 - from);
    out += z + 1 - from;
    *out++ = '.';
    *out++ = '0';
    from = z + 1;
  }
  std::memcpy(out, json.data() + from, json.size() - from);
  std::memset(buf.get() + *size, 0, kJsonPadding);
  return buf;
}

class Parser {
 public:
  Parser(std::string_view context) : context_(context) {}

  Error json_error(std::string detail) const { return Error::invalid_header_json(context_, detail); }

  Status parse_metadata(element value, std::optional<Metadata>* out) const {
    if (value.type() == element_type::NULL_VALUE) return ok_status();
    simdjson::dom::object obj;
    if (value.get_object().get(obj) != simdjson::SUCCESS) {
      return json_error("`__metadata__` must be an object of strings, found " + type_name(value.type()));
    }
    Metadata md;
    std::unordered_set<std::string_view> seen;
    for (auto kv : obj) {
      std::string_view v;
      if (kv.value.get_string().get(v) != simdjson::SUCCESS) {
        return json_error("`__metadata__` value for key " + quote(kv.key) + " must be a string, found " +
                          type_name(kv.value.type()));
      }
      if (!seen.insert(kv.key).second) return json_error("duplicate key " + quote(kv.key) + " in `__metadata__`");
      md.emplace_back(std::string(kv.key), std::string(v));
    }
    *out = std::move(md);
    return ok_status();
  }

  // Parses one entry into *t (name excepted). The shape is appended to *dims, and *t->shape records only its
  // rank (its data pointer is not to be used): the caller points it into `dims` once `dims` stops growing.
  Status parse_tensor(std::string_view name, element value, TensorInfo* t, std::vector<std::uint64_t>* dims) const {
    simdjson::dom::object obj;
    if (value.get_object().get(obj) != simdjson::SUCCESS) {
      return json_error("entry for tensor " + quote(name) + " must be an object, found " + type_name(value.type()));
    }
    bool have_dtype = false, have_shape = false, have_offsets = false;
    for (auto kv : obj) {
      bool* seen = nullptr;
      if (kv.key == "dtype") {
        seen = &have_dtype;
      } else if (kv.key == "shape") {
        seen = &have_shape;
      } else if (kv.key == "data_offsets") {
        seen = &have_offsets;
      } else {
        // Unknown fields inside an entry are ignored, within the reference's nesting limit.
        if (nested_deeper_than(kv.value, kMaxIgnoredNesting)) {
          return json_error("field " + quote(kv.key) + " of tensor " + quote(name) +
                            " is nested too deep: more than 127 levels of arrays and objects");
        }
        continue;
      }
      if (*seen) return json_error("duplicate field " + quote(kv.key) + " for tensor " + quote(name));
      *seen = true;
      if (seen == &have_dtype) {
        std::string_view code;
        if (kv.value.get_string().get(code) != simdjson::SUCCESS) {
          return json_error("`dtype` of tensor " + quote(name) + " must be a string, found " +
                            type_name(kv.value.type()));
        }
        auto d = dtype_from_code(code);
        if (!d) return json_error("unknown dtype " + quote(code) + " for tensor " + quote(name));
        t->dtype = *d;
      } else if (seen == &have_shape) {
        simdjson::dom::array arr;
        if (kv.value.get_array().get(arr) != simdjson::SUCCESS) {
          return json_error("`shape` of tensor " + quote(name) + " must be an array, found " +
                            type_name(kv.value.type()));
        }
        const std::size_t first = dims->size();
        for (element dim : arr) {
          std::uint64_t d;
          if (!get_u64(dim, &d)) {
            return json_error("`shape` of tensor " + quote(name) +
                              " must hold non-negative integers below 2^64, found " + type_name(dim.type()) +
                              (dim.type() == element_type::INT64 ? " that is negative" : ""));
          }
          dims->push_back(d);
        }
        t->shape = std::span<const std::uint64_t>(dims->data(), dims->size() - first);
      } else {
        simdjson::dom::array arr;
        if (kv.value.get_array().get(arr) != simdjson::SUCCESS) {
          return json_error("`data_offsets` of tensor " + quote(name) + " must be an array, found " +
                            type_name(kv.value.type()));
        }
        std::uint64_t v[2];
        std::size_t n = 0;
        for (element off : arr) {
          if (n == 2 || !get_u64(off, &v[n])) {
            return json_error("`data_offsets` of tensor " + quote(name) +
                              " must be two non-negative integers below 2^64");
          }
          ++n;
        }
        if (n != 2) {
          return json_error("`data_offsets` of tensor " + quote(name) +
                            " must be two non-negative integers below 2^64");
        }
        t->begin = v[0];
        t->end = v[1];
      }
    }
    if (!have_dtype) return json_error("missing field `dtype` for tensor " + quote(name));
    if (!have_shape) return json_error("missing field `shape` for tensor " + quote(name));
    if (!have_offsets) return json_error("missing field `data_offsets` for tensor " + quote(name));
    return ok_status();
  }

 private:
  std::string_view context_;
};

// Steps 6-10: tensors tile the data buffer exactly and every size computes without overflow.
Status validate_layout(const std::vector<TensorInfo>& tensors, std::uint64_t data_length, std::string_view context) {
  std::uint64_t expected = 0;
  for (const TensorInfo& t : tensors) {
    if (t.begin != expected || t.end < t.begin) return Error::invalid_offset(context, t.name);
    auto numel = checked_product(t.shape);
    if (!numel) return Error::validation_overflow(context, t.name);
    bool aligned = false;
    auto nbytes = checked_nbytes(*numel, dtype_bits(t.dtype), &aligned);
    if (!nbytes) return Error::validation_overflow(context, t.name);
    if (!aligned) return Error::misaligned_slice(context, t.name);
    if (t.end - t.begin != *nbytes) {
      return Error::tensor_invalid_info(context, t.name,
                                        "dtype " + std::string(dtype_code(t.dtype)) + " with " +
                                            std::to_string(*numel) + " elements needs " + std::to_string(*nbytes) +
                                            " bytes, but data_offsets [" + std::to_string(t.begin) + ", " +
                                            std::to_string(t.end) + "] span " + std::to_string(t.end - t.begin));
    }
    expected = t.end;
  }
  if (expected != data_length) {
    return Error::metadata_incomplete_buffer(context, "the tensors cover " + std::to_string(expected) + " bytes of a " +
                                                          std::to_string(data_length) + "-byte data buffer");
  }
  return ok_status();
}

}  // namespace

Result<ParsedHeader> parse_header_json(std::string_view json, std::uint64_t data_length, std::string_view context) {
  // Steps 4 and 5. The parse validates UTF-8 as it goes, so a header it accepts is valid UTF-8; only when it
  // refuses one is the UTF-8 checked on its own, so that step 4's error comes first whatever the parse saw.
  Parser p(context);
  const auto refused = [&](std::string detail) -> Error {
    if (!simdjson::validate_utf8(json.data(), json.size())) {
      return Error::invalid_header_utf8(context, "the header is not valid UTF-8");
    }
    return p.json_error(std::move(detail));
  };
  if (json.empty()) return p.json_error("the header is empty");
  const std::size_t header_length = json.size();
  std::size_t respelled_size = 0;
  const auto respelled = respell_negative_zero(json, &respelled_size);
  if (respelled) json = std::string_view(respelled.get(), respelled_size);
  // A parser keeps its buffers (about 10x the header) between parses: reuse one per thread for ordinary
  // headers (kReusedLimit).
  static ThreadCache<simdjson::dom::parser> reused;
  std::optional<simdjson::dom::parser> own;
  simdjson::dom::parser& dom = json.size() <= kReusedLimit ? reused.get() : own.emplace();
  element root;
  if (auto err = dom.parse(json.data(), json.size(), /*realloc_if_needed=*/false).get(root)) {
    return refused(simdjson::error_message(err));
  }
  simdjson::dom::object obj;
  if (root.get_object().get(obj) != simdjson::SUCCESS) {
    return p.json_error("the header must be a JSON object, found " + type_name(root.type()));
  }

  ParsedHeader out;
  // Unescaped keys are never longer than their JSON text, so an arena of json.size() bytes holds every name
  // and never reallocates: the views into it stay valid.
  out.names = std::make_unique_for_overwrite<char[]>(json.size());
  std::size_t names_used = 0;
  // Reserved so that they do not grow (and page-fault each copy) as they fill: most tensors have 1-2 dims.
  const std::size_t entries = std::min<std::size_t>(obj.size(), json.size() / 16 + 1);
  out.tensors.reserve(entries);
  out.dims.reserve(2 * entries);
  bool have_metadata = false;
  for (auto kv : obj) {
    if (kv.key == "__metadata__") {
      if (have_metadata) return p.json_error("duplicate key `__metadata__`");
      have_metadata = true;
      SAFETENSORS_RETURN_IF_ERROR(p.parse_metadata(kv.value, &out.metadata));
      continue;
    }
    if (kv.key.size() > json.size() - names_used) return p.json_error("tensor names longer than the header");
    std::memcpy(out.names.get() + names_used, kv.key.data(), kv.key.size());
    TensorInfo& t = out.tensors.emplace_back();
    t.name = std::string_view(out.names.get() + names_used, kv.key.size());
    names_used += kv.key.size();
    SAFETENSORS_RETURN_IF_ERROR(p.parse_tensor(kv.key, kv.value, &t, &out.dims));
  }
  // Each tensor's dims follow the previous tensor's in `dims` (header order, not sorted yet).
  std::size_t first_dim = 0;
  for (TensorInfo& t : out.tensors) {
    t.shape = std::span<const std::uint64_t>(out.dims.data() + first_dim, t.shape.size());
    first_dim += t.shape.size();
  }

  // Step 6 walks tensors in data_offsets order; ties keep header order, which is also the file order.
  // Writers emit offset order, so the sort is usually skipped.
  auto by_offsets = [](const TensorInfo& x, const TensorInfo& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  };
  if (!std::is_sorted(out.tensors.begin(), out.tensors.end(), by_offsets)) {
    std::stable_sort(out.tensors.begin(), out.tensors.end(), by_offsets);
  }

  // Duplicate names are part of step 5: detect them before looking at offsets.
  const std::size_t dup = out.index.build(out.tensors.size(), [&](std::size_t i) { return out.tensors[i].name; });
  if (dup != out.tensors.size()) return p.json_error("duplicate tensor name " + quote(out.tensors[dup].name));

  SAFETENSORS_RETURN_IF_ERROR(validate_layout(out.tensors, data_length, context));
  out.header_length = header_length;
  return out;
}

Result<ParsedHeader> read_header(const Source& source, std::uint64_t max_header_bytes) {
  const std::string& context = source.name();
  const std::uint64_t file_size = source.size();
  // Step 1.
  if (file_size < 8) return Error::header_too_small(context);
  std::byte prefix[8];
  SAFETENSORS_RETURN_IF_ERROR(read_exact(source, 0, prefix, "read of the header length"));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint64_t>(prefix[i]);
  // Step 2. (The cap also bounds the allocation below, together with step 3.)
  if (n > max_header_bytes) {
    return Error::header_too_large(context, "declared length " + std::to_string(n) + " exceeds the limit of " +
                                                std::to_string(max_header_bytes) + " bytes");
  }
  if (n > SIZE_MAX - kJsonPadding) {
    return Error::header_too_large(context, "declared length " + std::to_string(n) + " does not fit in memory");
  }
  // Step 3.
  auto header_end = checked_add(8, n);
  if (!header_end || *header_end > file_size) {
    return Error::invalid_header_length(context, "declared length " + std::to_string(n) + " runs past the end of the " +
                                                     std::to_string(file_size) + "-byte file");
  }
  // An in-memory file with at least kJsonPadding bytes after the header is parsed in place: the parser may
  // read (but never interprets) that many bytes past the end of its input. A mapped file is read like any
  // other, so a file that shrinks while it is opened gives kIo instead of SIGBUS.
  if (const std::byte* mem = source.data();
      mem != nullptr && source.data_is_memory() && file_size - *header_end >= kJsonPadding) {
    return parse_header_json(std::string_view(reinterpret_cast<const char*>(mem) + 8, n), file_size - *header_end,
                             context);
  }
  // Only now, with n <= file size, is a buffer of n bytes allocated.
  std::unique_ptr<char[]> own;
  char* buf = header_buffer(n + kJsonPadding, &own);
  std::memset(buf + n, 0, kJsonPadding);
  SAFETENSORS_RETURN_IF_ERROR(
      read_exact(source, 8, std::span<std::byte>(reinterpret_cast<std::byte*>(buf), n), "read of the header"));
  return parse_header_json(std::string_view(buf, n), file_size - *header_end, context);
}

}  // namespace safetensors::internal
