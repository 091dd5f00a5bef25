// Sharded checkpoints: the split and the transformers index the writer produces, opening by index or by
// file list, what the index hides, every index error, and reads (whole, sliced, parallel, concurrent).
#include "safetensors/sharded.h"

#include <sys/stat.h>

#include <filesystem>
#include <thread>

#include "test_util.h"

namespace safetensors {
namespace {

using test::TempDir;

struct Fixture {
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorData> tensors;

  void add(std::string name, Dtype dtype, std::vector<std::uint64_t> shape, std::uint32_t seed) {
    std::uint64_t numel = 1;
    for (auto d : shape) numel *= d;
    data.push_back(test::random_bytes(numel * dtype_bits(dtype) / 8, seed));
    // Moving an inner vector keeps its buffer, so the spans of earlier tensors stay valid as `data` grows.
    tensors.push_back({std::move(name), dtype, std::move(shape), data.back()});
  }
};

// Twelve tensors of mixed dtypes, 1..~400 bytes each.
Fixture model(int n = 12) {
  Fixture fx;
  fx.data.reserve(n);
  for (int i = 0; i < n; ++i) {
    const Dtype dt = i % 3 == 0 ? Dtype::kF32 : i % 3 == 1 ? Dtype::kBF16 : Dtype::kI64;
    fx.add("layers." + std::to_string(i) + ".weight", dt, {1 + std::uint64_t(i % 4), 2 + std::uint64_t(i % 5)}, 10 + i);
  }
  return fx;
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

std::vector<std::string> dir_listing(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// ---------------------------------------------------------------------------------------------------------
// Writing

TEST(ShardedWriteTest, SplitsGreedilyAndWritesTheIndexByteForByteAsTransformers) {
  TempDir dir;
  Fixture fx;
  fx.data.reserve(3);
  fx.add("a", Dtype::kU8, {16}, 1);
  fx.add("caf\xc3\xa9 \"q\"\x7f\xf0\x9f\x98\x80\n", Dtype::kU8, {8}, 2);
  fx.add("b.weight", Dtype::kF32, {4}, 3);
  auto plan = save_sharded(dir.path().string(), fx.tensors, {.max_shard_bytes = 24});
  ASSERT_ST_OK(plan);
  ASSERT_EQ(plan->shards.size(), 2u);
  EXPECT_EQ(plan->shards[0].file_name, "model-00001-of-00002.safetensors");
  EXPECT_EQ(plan->shards[0].inputs, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(plan->shards[0].bytes, 24u);
  EXPECT_EQ(plan->shards[1].file_name, "model-00002-of-00002.safetensors");
  EXPECT_EQ(plan->shards[1].inputs, (std::vector<std::size_t>{2}));
  EXPECT_EQ(plan->total_size, 40u);
  EXPECT_EQ(plan->index_file_name, "model.safetensors.index.json");
  // Python: json.dumps(index, indent=2, sort_keys=True) + "\n".
  const std::string expected =
      "{\n  \"metadata\": {\n    \"total_size\": 40\n  },\n  \"weight_map\": {\n"
      "    \"a\": \"model-00001-of-00002.safetensors\",\n"
      "    \"b.weight\": \"model-00002-of-00002.safetensors\",\n"
      "    \"caf\\u00e9 \\\"q\\\"\\u007f\\ud83d\\ude00\\n\": \"model-00001-of-00002.safetensors\"\n"
      "  }\n}\n";
  EXPECT_EQ(plan->index_json, expected);
  EXPECT_EQ(test::read_bytes(dir.file("model.safetensors.index.json")), expected);
  EXPECT_EQ(dir_listing(dir),
            (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                      "model.safetensors.index.json"}));

  // Each shard is exactly what save_file writes for its tensors.
  auto first = serialize(std::vector<TensorData>{fx.tensors[0], fx.tensors[1]});
  ASSERT_ST_OK(first);
  EXPECT_EQ(test::read_bytes(dir.file("model-00001-of-00002.safetensors")), test::to_string(*first));
}

// A tensor larger than the limit: plan_shards_oversized_tensor_test.cc.

TEST(ShardedWriteTest, ShardFileNamesAreOneRuleForWritingAndRecognizing) {
  EXPECT_EQ(shard_file_name("model", 1, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(shard_file_name("m.v2", 12, 123456), "m.v2-00012-of-123456.safetensors");
  for (std::size_t n : {1u, 2u, 7u}) {
    for (std::size_t i = 1; i <= n; ++i) EXPECT_TRUE(is_shard_file_name("model", shard_file_name("model", i, n)));
  }
  EXPECT_TRUE(is_shard_file_name("m.v2", "m.v2-00012-of-123456.safetensors"));
  EXPECT_TRUE(is_shard_file_name("model", "model-100000-of-100000.safetensors"));
  // Not a name plan_shards gives for this prefix.
  for (const char* name :
       {"model.safetensors", "model.safetensors.index.json", "model-00001-of-00002.safetensors.tmp",
        "model-0001-of-00002.safetensors", "model-00001-of-0002.safetensors", "model-000001-of-00002.safetensors",
        "model-00003-of-00002.safetensors", "model-00000-of-00002.safetensors", "model-00001-of-00000.safetensors",
        "model-+0001-of-00002.safetensors", "model-00001_of-00002.safetensors", "other-00001-of-00002.safetensors",
        "xmodel-00001-of-00002.safetensors", "model-x-00001-of-00002.safetensors", "model-00001-of-00002.safetensor",
        "model-99999999999999999999-of-99999999999999999999.safetensors", "model", ""}) {
    EXPECT_FALSE(is_shard_file_name("model", name)) << name;
  }
  // Every shard name a plan gives is recognized, and the index is not.
  Fixture fx;
  fx.data.reserve(3);
  fx.add("a", Dtype::kU8, {10}, 1);
  fx.add("b", Dtype::kU8, {10}, 2);
  fx.add("c", Dtype::kU8, {10}, 3);
  auto plan = plan_shards(fx.tensors, {.max_shard_bytes = 10, .prefix = "ckpt"});
  ASSERT_ST_OK(plan);
  ASSERT_EQ(plan->shards.size(), 3u);
  for (const auto& shard : plan->shards) EXPECT_TRUE(is_shard_file_name("ckpt", shard.file_name)) << shard.file_name;
  EXPECT_FALSE(is_shard_file_name("ckpt", plan->index_file_name));
}

TEST(ShardedWriteTest, PrefixMetadataAndPermissionsOfAnExistingIndex) {
  TempDir dir;
  Fixture fx = model(4);
  ShardingOptions opt{.max_shard_bytes = 1, .prefix = "diffusion_pytorch_model"};
  opt.shard_metadata = Metadata{{"format", "pt"}};
  const std::string index = dir.file("diffusion_pytorch_model.safetensors.index.json");
  test::write_bytes(index, "old");
  ASSERT_EQ(::chmod(index.c_str(), 0640), 0);
  auto plan = save_sharded(dir.path().string(), fx.tensors, opt);
  ASSERT_ST_OK(plan);
  ASSERT_EQ(plan->shards.size(), 4u);
  EXPECT_EQ(plan->shards[3].file_name, "diffusion_pytorch_model-00004-of-00004.safetensors");
  struct stat st;
  ASSERT_EQ(::stat(index.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  auto ckpt = ShardedFile::open_index(index);
  ASSERT_ST_OK(ckpt);
  for (const File& shard : ckpt->shards()) {
    ASSERT_TRUE(shard.metadata().has_value());
    EXPECT_EQ(*shard.metadata(), (Metadata{{"format", "pt"}}));
  }
}

TEST(ShardedWriteTest, NoTensorsGiveAnEmptyIndexThatOpens) {
  TempDir dir;
  auto plan = save_sharded(dir.path().string(), std::span<const TensorData>{});
  ASSERT_ST_OK(plan);
  EXPECT_TRUE(plan->shards.empty());
  EXPECT_EQ(test::read_bytes(dir.file("model.safetensors.index.json")),
            "{\n  \"metadata\": {\n    \"total_size\": 0\n  },\n  \"weight_map\": {}\n}\n");
  auto ckpt = ShardedFile::open_index(dir.file("model.safetensors.index.json"));
  ASSERT_ST_OK(ckpt);
  EXPECT_TRUE(ckpt->tensors().empty());
  EXPECT_TRUE(ckpt->shards().empty());
  EXPECT_EQ(ckpt->total_size(), 0u);
}

// huggingface_hub's split_torch_state_dict_into_shards({}) gives no files and total_size 0 (is_sharded=False):
// the plan matches it, and a caller that wants one file (the CLI's convert) writes an empty single file.
TEST(ShardedWriteTest, TheEmptyPlanMatchesHuggingfaceHub) {
  auto plan = plan_shards(std::span<const TensorData>{}, {.max_shard_bytes = 10});
  ASSERT_ST_OK(plan);
  EXPECT_TRUE(plan->shards.empty());
  EXPECT_EQ(plan->total_size, 0u);
}

TEST(ShardedWriteTest, WriteIndexKeepsModeBitsAndSyncsWhenAsked) {
  TempDir dir;
  Fixture fx = model(3);
  auto plan = plan_shards(fx.tensors, {.max_shard_bytes = 1});
  ASSERT_ST_OK(plan);
  const std::string index = dir.file(plan->index_file_name);
  test::write_bytes(index, "old");
  ASSERT_EQ(::chmod(index.c_str(), 0604), 0);
  ASSERT_ST_OK(write_index(dir.path().string(), *plan, {.fsync = true}));
  EXPECT_EQ(test::read_bytes(index), plan->index_json);
  struct stat st;
  ASSERT_EQ(::stat(index.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0604u);
  EXPECT_EQ(dir_listing(dir), std::vector<std::string>{plan->index_file_name});  // no temporary left
  EXPECT_ST_ERROR(write_index(dir.file("missing"), *plan), kNotFound);
}

// ShardIndex is what open_index() and the CLI's verify check shards with, one shard at a time.
TEST(ShardIndexTest, ParsesAssignsAndSelectsPerShard) {
  auto index = ShardIndex::parse("/d/m.json",
                                 R"({"metadata": {"total_size": 7, "x": "y"}, "other": 1,
                                     "weight_map": {"b": "s2", "a": "s1", "c": "s2"}})");
  ASSERT_ST_OK(index);
  EXPECT_EQ(index->shard_names, (std::vector<std::string>{"s1", "s2"}));
  EXPECT_EQ(index->shard_path(1), "/d/s2");
  EXPECT_EQ(index->assigned(1), (std::vector<std::string_view>{"b", "c"}));
  EXPECT_EQ(index->total_size, 7u);
  EXPECT_EQ(index->metadata_json, R"({"total_size":7,"x":"y"})");
  EXPECT_EQ(*index->metadata, (Metadata{{"total_size", "7"}, {"x", "y"}}));

  TempDir dir;
  Fixture fx;
  fx.data.reserve(3);
  fx.add("c", Dtype::kU8, {1}, 1);
  fx.add("b", Dtype::kU8, {1}, 2);
  fx.add("stale", Dtype::kU8, {1}, 3);
  ASSERT_ST_OK(save_file(dir.file("s2"), fx.tensors));
  auto shard = File::open(dir.file("s2"));
  ASSERT_ST_OK(shard);
  auto selected = index->select(*shard, 1);
  ASSERT_ST_OK(selected);
  std::vector<std::string> names;
  for (const TensorInfo* t : *selected) names.emplace_back(t->name);
  EXPECT_EQ(names, (std::vector<std::string>{"b", "c"}));  // file order (b sorts first by alignment, then name)
  auto missing = index->select(*shard, 0);
  EXPECT_ST_ERROR(missing, kTensorNotFound);
  EXPECT_EQ(missing.error().context(), dir.file("s2"));
  EXPECT_EQ(missing.error().tensor(), "a");
  EXPECT_ST_ERROR(index->select(*shard, 2), kInvalidArgument);

  for (const char* bad : {"{", "[]", R"({"weight_map": []})", R"({"weight_map": {"a": "x", "a": "y"}})",
                          R"({"weight_map": {"a": "../x"}})", R"({"weight_map": {}, "metadata": 3})"}) {
    auto r = ShardIndex::parse("m.json", bad);
    SCOPED_TRACE(bad);
    EXPECT_ST_ERROR(r, kInvalidArgument);
    if (!r.ok()) {
      EXPECT_EQ(r.error().context(), "m.json");
    }
  }
}

TEST(ShardedWriteTest, RefusesBadInputsBeforeWritingAnything) {
  TempDir dir;
  Fixture fx = model(6);
  // A size mismatch in the last shard is found before the first shard is written.
  std::vector<TensorData> bad = fx.tensors;
  bad.back().data = bad.back().data.first(1);
  EXPECT_ST_ERROR(save_sharded(dir.path().string(), bad, {.max_shard_bytes = 1}), kTensorInvalidInfo);
  EXPECT_TRUE(dir_listing(dir).empty());

  std::vector<TensorData> dup = fx.tensors;
  dup[4].name = dup[1].name;
  auto d = plan_shards(dup, {.max_shard_bytes = 1});
  EXPECT_ST_ERROR(d, kInvalidArgument);
  EXPECT_NE(d.error().to_string().find("duplicate tensor name `layers.1.weight`"), std::string::npos);

  std::vector<TensorData> not_utf8 = fx.tensors;
  not_utf8[0].name = "\xff";
  EXPECT_ST_ERROR(plan_shards(not_utf8), kInvalidArgument);
  EXPECT_ST_ERROR(plan_shards(fx.tensors, {.prefix = ""}), kInvalidArgument);
  EXPECT_ST_ERROR(plan_shards(fx.tensors, {.prefix = "a/b"}), kInvalidArgument);
  EXPECT_ST_ERROR(plan_shards(fx.tensors, {.prefix = std::string("a\0b", 3)}), kInvalidArgument);

  std::vector<TensorData> misaligned = {{"f4", Dtype::kF4, {3}, {}}};
  EXPECT_ST_ERROR(save_sharded(dir.path().string(), misaligned), kMisalignedSlice);
  EXPECT_TRUE(dir_listing(dir).empty());

  EXPECT_ST_ERROR(save_sharded(dir.file("missing"), fx.tensors), kNotFound);
}

// ---------------------------------------------------------------------------------------------------------
// Opening and reading

TEST(ShardedFileTest, RoundTripThroughTheIndexOnEveryBackend) {
  TempDir dir;
  Fixture fx = model(12);
  auto plan = save_sharded(dir.path().string(), fx.tensors, {.max_shard_bytes = 150});
  ASSERT_ST_OK(plan);
  ASSERT_EQ(plan->shards.size(), 5u);
  for (Backend b : {Backend::kMmap, Backend::kPread}) {
    auto ckpt = ShardedFile::open_index(dir.file("model.safetensors.index.json"), {.backend = b});
    ASSERT_ST_OK(ckpt);
    EXPECT_EQ(ckpt->index_path(), dir.file("model.safetensors.index.json"));
    EXPECT_EQ(ckpt->total_size(), plan->total_size);
    ASSERT_TRUE(ckpt->index_metadata().has_value());
    EXPECT_EQ(*ckpt->index_metadata(), (Metadata{{"total_size", std::to_string(plan->total_size)}}));
    ASSERT_EQ(ckpt->shards().size(), plan->shards.size());
    ASSERT_EQ(ckpt->tensors().size(), fx.tensors.size());
    for (std::size_t s = 0; s < plan->shards.size(); ++s) {
      EXPECT_EQ(ckpt->shards()[s].path(), dir.file(plan->shards[s].file_name));
      EXPECT_EQ(ckpt->shards()[s].backend(), test::read_path_of(b));
    }
    auto keys = ckpt->keys();
    EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
    for (std::size_t s = 0; s < plan->shards.size(); ++s) {
      for (std::size_t i : plan->shards[s].inputs) {
        const TensorData& want = fx.tensors[i];
        auto info = ckpt->info(want.name);
        ASSERT_ST_OK(info);
        EXPECT_EQ(ckpt->shard_of(**info), s);
        EXPECT_EQ(&ckpt->file_of(**info), &ckpt->shards()[s]);
        EXPECT_EQ((*info)->dtype, want.dtype);
        EXPECT_EQ(test::shape_of(**info), want.shape);
        std::vector<std::byte> buf((*info)->nbytes());
        ASSERT_ST_OK(ckpt->read_into(want.name, buf));
        EXPECT_TRUE(same(buf, want.data)) << want.name;
        auto v = ckpt->view(**info);
        if (b == Backend::kMmap) {
          ASSERT_ST_OK(v);
          EXPECT_TRUE(same(test::native_copy(v->bytes, want.dtype), want.data));
          EXPECT_TRUE(v->writable);
        } else {
          EXPECT_ST_ERROR(v, kInvalidArgument);
        }
      }
    }
    // tensors(): shard by shard, each in file order.
    std::size_t last_shard = 0;
    std::uint64_t last_begin = 0;
    for (const TensorInfo& t : ckpt->tensors()) {
      const std::size_t s = ckpt->shard_of(t);
      ASSERT_GE(s, last_shard);
      if (s == last_shard) {
        EXPECT_GE(t.begin, last_begin);
      }
      last_shard = s;
      last_begin = t.begin;
    }
  }
}

TEST(ShardedFileTest, TheIndexDecidesWhatIsVisible) {
  TempDir dir;
  Fixture fx = model(6);
  // Shard A holds layers.0..2, shard B holds layers.2..5: layers.2 is in both.
  ASSERT_ST_OK(save_file(dir.file("A.safetensors"), std::span(fx.tensors).first(3)));
  ASSERT_ST_OK(save_file(dir.file("B.safetensors"), std::span(fx.tensors).subspan(2)));
  ASSERT_TRUE(std::filesystem::create_directory(dir.file("sub")));
  ASSERT_ST_OK(save_file(dir.file("sub/C.safetensors"), std::span(fx.tensors).first(1)));
  test::write_bytes(dir.file("index.json"), R"({
    "metadata": {"total_size": 7, "format": "pt", "nested": {"a": [1, 2.5, null]}},
    "unknown": [1, 2, 3],
    "weight_map": {
      "layers.0.weight": "sub/C.safetensors",
      "layers.1.weight": "A.safetensors",
      "layers.2.weight": "B.safetensors",
      "layers.4.weight": "B.safetensors"
    }
  })");
  auto ckpt = ShardedFile::open_index(dir.file("index.json"));
  ASSERT_ST_OK(ckpt);
  ASSERT_EQ(ckpt->shards().size(), 3u);
  EXPECT_EQ(ckpt->shards()[0].path(), dir.file("A.safetensors"));
  EXPECT_EQ(ckpt->shards()[1].path(), dir.file("B.safetensors"));
  EXPECT_EQ(ckpt->shards()[2].path(), dir.file("sub/C.safetensors"));
  EXPECT_EQ(ckpt->keys(), (std::vector<std::string_view>{"layers.0.weight", "layers.1.weight", "layers.2.weight",
                                                         "layers.4.weight"}));
  EXPECT_EQ(ckpt->find("layers.3.weight"), nullptr);  // in B, but not assigned to it
  EXPECT_ST_ERROR(ckpt->info("layers.5.weight"), kTensorNotFound);
  EXPECT_EQ(ckpt->shard_of(*ckpt->find("layers.0.weight")), 2u);
  EXPECT_EQ(ckpt->shard_of(*ckpt->find("layers.2.weight")), 1u);  // B's copy, as the index says
  EXPECT_EQ(ckpt->total_size(), 7u);
  EXPECT_EQ(*ckpt->index_metadata(),
            (Metadata{{"total_size", "7"}, {"format", "pt"}, {"nested", R"({"a":[1,2.5,null]})"}}));
  std::vector<std::byte> buf(fx.tensors[2].data.size());
  ASSERT_ST_OK(ckpt->read_into("layers.2.weight", buf));
  EXPECT_TRUE(same(buf, fx.tensors[2].data));

  auto err = ckpt->info("nope");
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.error().context(), dir.file("index.json"));
  EXPECT_EQ(err.error().tensor(), "nope");
}

TEST(ShardedFileTest, IndexErrorsNameTheIndexAndAreInvalidArgument) {
  TempDir dir;
  Fixture fx = model(2);
  ASSERT_ST_OK(save_file(dir.file("s.safetensors"), fx.tensors));
  const std::string index = dir.file("m.safetensors.index.json");
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "invalid index:"},
      {"[]", "must be a JSON object"},
      {R"({"metadata": {}})", "missing `weight_map`"},
      {R"({"weight_map": []})", "`weight_map` must be an object"},
      {R"({"weight_map": {"layers.0.weight": 3}})", "value for tensor `layers.0.weight` must be a string"},
      {R"({"weight_map": {"layers.0.weight": "s.safetensors", "layers.0.weight": "s.safetensors"}})",
       "duplicate key `layers.0.weight` in `weight_map`"},
      {R"({"weight_map": {}, "weight_map": {}})", "duplicate key `weight_map`"},
      {R"({"weight_map": {}, "metadata": {"a": "1", "a": "2"}})", "duplicate key `a` in `metadata`"},
      {R"({"weight_map": {}, "metadata": "x"})", "`metadata` must be an object"},
      {R"({"weight_map": {"x": "/etc/passwd"}})", "not a relative path"},
      {R"({"weight_map": {"x": "../s.safetensors"}})", "not a relative path"},
      {R"({"weight_map": {"x": "a/../../s.safetensors"}})", "not a relative path"},
      {R"({"weight_map": {"x": ""}})", "not a relative path"},
      {R"({"weight_map": {"x": "s\u0000.safetensors"}})", "not a relative path"},
      {"{\"weight_map\": {\"\xff\": \"s.safetensors\"}}", "invalid index:"},
  };
  for (const auto& [json, text] : cases) {
    test::write_bytes(index, json);
    auto r = ShardedFile::open_index(index);
    ASSERT_FALSE(r.ok()) << json;
    EXPECT_EQ(r.error().kind(), Error::Kind::kInvalidArgument) << json << ": " << r.error().to_string();
    EXPECT_EQ(r.error().context(), index) << json;
    EXPECT_NE(r.error().to_string().find(text), std::string::npos) << json << ": " << r.error().to_string();
  }
  // Null metadata is absent metadata; other keys are ignored.
  test::write_bytes(index, R"({"weight_map": {"layers.1.weight": "s.safetensors"}, "metadata": null, "x": 1})");
  auto ok = ShardedFile::open_index(index);
  ASSERT_ST_OK(ok);
  EXPECT_FALSE(ok->index_metadata().has_value());
  EXPECT_FALSE(ok->total_size().has_value());
  EXPECT_EQ(ok->keys(), (std::vector<std::string_view>{"layers.1.weight"}));

  // An index larger than the cap is refused before it is parsed.
  test::write_bytes(index, std::string(100, ' ') + "{\"weight_map\": {}}");
  EXPECT_ST_ERROR(ShardedFile::open_index(index, {.max_header_bytes = 64}), kInvalidArgument);
}

TEST(ShardedFileTest, ShardErrorsNameTheShardAndTheTensor) {
  TempDir dir;
  Fixture fx = model(2);
  ASSERT_ST_OK(save_file(dir.file("s.safetensors"), fx.tensors));
  const std::string index = dir.file("i.json");

  EXPECT_ST_ERROR(ShardedFile::open_index(dir.file("missing.json")), kNotFound);

  test::write_bytes(index, R"({"weight_map": {"layers.0.weight": "gone.safetensors"}})");
  auto missing = ShardedFile::open_index(index);
  EXPECT_ST_ERROR(missing, kNotFound);
  EXPECT_EQ(missing.error().context(), dir.file("gone.safetensors"));

  test::write_bytes(index, R"({"weight_map": {"layers.0.weight": "s.safetensors", "ghost": "s.safetensors"}})");
  auto ghost = ShardedFile::open_index(index);
  EXPECT_ST_ERROR(ghost, kTensorNotFound);
  EXPECT_EQ(ghost.error().context(), dir.file("s.safetensors"));
  EXPECT_EQ(ghost.error().tensor(), "ghost");

  test::write_bytes(dir.file("bad.safetensors"), test::raw_file("{}", "xx"));
  test::write_bytes(index, R"({"weight_map": {"layers.0.weight": "bad.safetensors"}})");
  auto bad = ShardedFile::open_index(index);
  EXPECT_ST_ERROR(bad, kMetadataIncompleteBuffer);
  EXPECT_EQ(bad.error().context(), dir.file("bad.safetensors"));

  // An index in the current directory names shards relative to it.
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  test::write_bytes("rel.json", R"({"weight_map": {"layers.1.weight": "s.safetensors"}})");
  auto rel = ShardedFile::open_index("rel.json");
  std::filesystem::current_path(cwd);
  ASSERT_ST_OK(rel);
  EXPECT_EQ(rel->shards()[0].path(), "s.safetensors");
}

TEST(ShardedFileTest, OpenFilesShowsEverythingAndRefusesARepeatedName) {
  TempDir dir;
  Fixture fx = model(6);
  ASSERT_ST_OK(save_file(dir.file("a.safetensors"), std::span(fx.tensors).first(2)));
  ASSERT_ST_OK(save_file(dir.file("b.safetensors"), std::span(fx.tensors).subspan(2)));
  const std::vector<std::string> paths = {dir.file("b.safetensors"), dir.file("a.safetensors")};
  auto ckpt = ShardedFile::open_files(paths);
  ASSERT_ST_OK(ckpt);
  EXPECT_EQ(ckpt->index_path(), "");
  EXPECT_FALSE(ckpt->index_metadata().has_value());
  ASSERT_EQ(ckpt->tensors().size(), 6u);
  EXPECT_EQ(ckpt->shards()[0].path(), paths[0]);
  EXPECT_EQ(ckpt->shard_of(ckpt->tensors().front()), 0u);
  EXPECT_EQ(ckpt->shard_of(ckpt->tensors().back()), 1u);
  EXPECT_EQ(ckpt->shard_of(*ckpt->find("layers.0.weight")), 1u);
  for (const TensorData& want : fx.tensors) {
    std::vector<std::byte> buf(want.data.size());
    ASSERT_ST_OK(ckpt->read_into(want.name, buf));
    EXPECT_TRUE(same(buf, want.data));
  }
  EXPECT_ST_ERROR(ckpt->info("nope"), kTensorNotFound);

  ASSERT_ST_OK(save_file(dir.file("c.safetensors"), std::span(fx.tensors).subspan(5)));
  const std::vector<std::string> overlapping = {dir.file("a.safetensors"), dir.file("b.safetensors"),
                                                dir.file("c.safetensors")};
  auto dup = ShardedFile::open_files(overlapping);
  EXPECT_ST_ERROR(dup, kInvalidArgument);
  EXPECT_EQ(dup.error().context(), dir.file("c.safetensors"));
  EXPECT_NE(dup.error().to_string().find("tensor `layers.5.weight` is also in \"" + dir.file("b.safetensors") + "\""),
            std::string::npos)
      << dup.error().to_string();

  const std::vector<std::string> with_missing = {dir.file("a.safetensors"), dir.file("nope.safetensors")};
  auto missing = ShardedFile::open_files(with_missing);
  EXPECT_ST_ERROR(missing, kNotFound);
  EXPECT_EQ(missing.error().context(), dir.file("nope.safetensors"));
}

TEST(ShardedFileTest, ForeignTensorInfosAndWrongSizesAreInvalidArguments) {
  TempDir dir;
  Fixture fx = model(4);
  ASSERT_ST_OK(save_sharded(dir.path().string(), fx.tensors, {.max_shard_bytes = 100}));
  auto ckpt = ShardedFile::open_index(dir.file("model.safetensors.index.json"));
  ASSERT_ST_OK(ckpt);
  const TensorInfo& mine = *ckpt->find("layers.1.weight");
  // The same entry as seen through the shard's own File is not an element of tensors().
  const TensorInfo& foreign = *ckpt->file_of(mine).find("layers.1.weight");
  std::vector<std::byte> buf(mine.nbytes());
  EXPECT_ST_ERROR(ckpt->read_into(foreign, buf), kInvalidArgument);
  EXPECT_ST_ERROR(ckpt->view(foreign), kInvalidArgument);
  EXPECT_ST_ERROR(ckpt->plan_slice(foreign, {}), kInvalidArgument);
  auto whole = ckpt->plan_slice(mine, {});
  ASSERT_ST_OK(whole);
  EXPECT_ST_ERROR(ckpt->read_slice(foreign, *whole, buf), kInvalidArgument);
  EXPECT_NE(
      ckpt->view(foreign).error().to_string().find("tensor `layers.1.weight` is not an entry of this sharded file"),
      std::string::npos)
      << ckpt->view(foreign).error().to_string();
  const TensorInfo copy = mine;
  EXPECT_ST_ERROR(ckpt->read_into(copy, buf), kInvalidArgument);
  const ReadRequest foreign_request{&foreign, buf};
  EXPECT_ST_ERROR(ckpt->read_many(std::span(&foreign_request, 1)), kInvalidArgument);
  const ReadRequest null_request{nullptr, buf};
  EXPECT_ST_ERROR(ckpt->read_many(std::span(&null_request, 1)), kInvalidArgument);

  std::vector<std::byte> small(mine.nbytes() - 1);
  auto wrong = ckpt->read_into(mine, small);
  EXPECT_ST_ERROR(wrong, kInvalidArgument);
  EXPECT_EQ(wrong.error().context(), ckpt->file_of(mine).path());
  const ReadRequest short_request{&mine, small};
  EXPECT_ST_ERROR(ckpt->read_many(std::span(&short_request, 1)), kInvalidArgument);
}

TEST(ShardedFileTest, SlicesReadOnlyTheirBytesFromTheRightShard) {
  TempDir dir;
  Fixture fx;
  fx.data.reserve(2);
  fx.add("first", Dtype::kI32, {4, 3}, 1);
  fx.add("second", Dtype::kI32, {4, 3}, 2);
  ASSERT_ST_OK(save_sharded(dir.path().string(), fx.tensors, {.max_shard_bytes = 48}));
  for (Backend b : {Backend::kMmap, Backend::kPread}) {
    auto ckpt = ShardedFile::open_index(dir.file("model.safetensors.index.json"), {.backend = b});
    ASSERT_ST_OK(ckpt);
    ASSERT_EQ(ckpt->shards().size(), 2u);
    const TensorInfo& t = *ckpt->find("second");
    const SliceIndex idx[] = {SliceIndex::range(3, 0, -2), SliceIndex::at(-1)};  // rows 3, 1; column 2
    auto plan = ckpt->plan_slice(t, idx);
    ASSERT_ST_OK(plan);
    EXPECT_EQ(plan->shape(), (std::vector<std::uint64_t>{2}));
    std::vector<std::byte> out(plan->nbytes());
    ASSERT_ST_OK(ckpt->read_slice(t, *plan, out));
    const auto& src = fx.tensors[1].data;
    EXPECT_TRUE(same(std::span(out).first(4), src.subspan((3 * 3 + 2) * 4, 4)));
    EXPECT_TRUE(same(std::span(out).last(4), src.subspan((1 * 3 + 2) * 4, 4)));
    const SliceIndex oob[] = {SliceIndex::at(4)};
    auto bad = ckpt->plan_slice(t, oob);
    EXPECT_ST_ERROR(bad, kInvalidSlice);
    EXPECT_EQ(bad.error().context(), dir.file("model-00002-of-00002.safetensors"));
    EXPECT_EQ(bad.error().tensor(), "second");
  }
}

TEST(ShardedFileTest, ReadManyAcrossShardsInParallel) {
  TempDir dir;
  Fixture fx = model(12);
  // One tensor above the 8 MiB chunk, so it is split between threads.
  fx.data.reserve(13);
  fx.add("big", Dtype::kU8, {(9u << 20) + 5}, 99);
  ASSERT_ST_OK(save_sharded(dir.path().string(), fx.tensors, {.max_shard_bytes = 100}));
  for (Backend b : {Backend::kMmap, Backend::kPread}) {
    auto ckpt = ShardedFile::open_index(dir.file("model.safetensors.index.json"), {.backend = b});
    ASSERT_ST_OK(ckpt);
    ASSERT_GT(ckpt->shards().size(), 3u);
    for (unsigned threads : {0u, 1u, 4u}) {
      std::vector<std::vector<std::byte>> out(fx.tensors.size());
      std::vector<ReadRequest> requests;
      for (std::size_t i = 0; i < fx.tensors.size(); ++i) {
        out[i].resize(fx.tensors[i].data.size());
        requests.push_back({ckpt->find(fx.tensors[i].name), out[i]});
      }
      ASSERT_ST_OK(ckpt->read_many(requests, threads));
      for (std::size_t i = 0; i < fx.tensors.size(); ++i) {
        EXPECT_TRUE(same(out[i], fx.tensors[i].data)) << fx.tensors[i].name << " threads=" << threads;
      }
    }
    EXPECT_ST_OK(ckpt->read_many({}));
  }
}

TEST(ShardedFileTest, EightThreadsUseOneShardedFileConcurrently) {
  TempDir dir;
  Fixture fx = model(24);
  ASSERT_ST_OK(save_sharded(dir.path().string(), fx.tensors, {.max_shard_bytes = 400}));
  auto ckpt = ShardedFile::open_index(dir.file("model.safetensors.index.json"), {.backend = Backend::kPread});
  ASSERT_ST_OK(ckpt);
  const ShardedFile shared = *ckpt;
  std::atomic<int> mismatches{0};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 20; ++round) {
          const TensorData& want = fx.tensors[(t * 7 + round) % fx.tensors.size()];
          std::vector<std::byte> buf(want.data.size());
          auto info = shared.info(want.name);
          if (!info.ok() || !shared.read_into(**info, buf).ok() || !same(buf, want.data)) ++mismatches;
        }
      });
    }
  }
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ShardedFileTest, ViewsKeepTheirShardMappedAfterTheShardedFileDies) {
  TempDir dir;
  Fixture fx = model(4);
  ASSERT_ST_OK(save_sharded(dir.path().string(), fx.tensors, {.max_shard_bytes = 1}));
  const std::uint64_t before = testing::live_mappings();
  TensorView view;
  {
    auto ckpt = ShardedFile::open_index(dir.file("model.safetensors.index.json"));
    ASSERT_ST_OK(ckpt);
    EXPECT_EQ(testing::live_mappings(), before + 4);
    auto v = ckpt->view("layers.2.weight");
    ASSERT_ST_OK(v);
    view = *v;
  }
  EXPECT_EQ(testing::live_mappings(), before + 1);
  EXPECT_TRUE(same(test::native_copy(view.bytes, fx.tensors[2].dtype), fx.tensors[2].data));
  view = {};
  EXPECT_EQ(testing::live_mappings(), before);
}

}  // namespace
}  // namespace safetensors
