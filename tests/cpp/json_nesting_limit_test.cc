// Found by tests/python/test_mutations_differential.py: a field the schema ignores could nest
// arrays and objects up to simdjson's limit of 1024 levels, where the reference's JSON reader refuses more
// than 127 levels in the whole document. Now both draw the line at the same place.
// Regression inputs: fuzz/regressions/header/nesting_*.
#include <string>

#include "test_util.h"

namespace safetensors {
namespace {

using test::open_bytes;
using test::raw_file;

// A tensor entry (the document's second level) whose ignored field "x" holds `levels` nested containers.
std::string nested(int levels, bool objects) {
  std::string inner = objects ? "1" : "";
  for (int i = 0; i < levels; ++i) inner = objects ? "{\"k\":" + inner + "}" : "[" + inner + "]";
  return raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":)" + inner + "}}");
}

TEST(JsonNestingLimit, AtMost127LevelsInTheWholeDocument) {
  for (bool objects : {false, true}) {
    SCOPED_TRACE(objects ? "objects" : "arrays");
    ASSERT_ST_OK(open_bytes(nested(125, objects)));
    auto deep = open_bytes(nested(126, objects));
    EXPECT_ST_ERROR(deep, kInvalidHeaderJson);
    EXPECT_EQ(deep.error().detail(),
              "field `x` of tensor `a` is nested too deep: more than 127 levels of arrays and objects");
    EXPECT_ST_ERROR(open_bytes(nested(1000, objects)), kInvalidHeaderJson);
  }
}

}  // namespace
}  // namespace safetensors
