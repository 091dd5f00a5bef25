// src/util/path.h: the one home of the library's path arithmetic.
#include "util/path.h"

#include <gtest/gtest.h>

namespace safetensors::internal {
namespace {

TEST(PathTest, DirnameIsPosixDirname) {
  EXPECT_EQ(dirname_of("a/b/c.safetensors"), "a/b");
  EXPECT_EQ(dirname_of("/c.safetensors"), "/");
  EXPECT_EQ(dirname_of("c.safetensors"), ".");
  EXPECT_EQ(dirname_of("./c"), ".");
  EXPECT_EQ(dirname_of("/a/c"), "/a");
}

TEST(PathTest, BasenameIsTheLastComponent) {
  EXPECT_EQ(basename_of("a/b/c.safetensors"), "c.safetensors");
  EXPECT_EQ(basename_of("/c"), "c");
  EXPECT_EQ(basename_of("c"), "c");
}

TEST(PathTest, JoinAddsOneSeparator) {
  EXPECT_EQ(join_path("dir", "x"), "dir/x");
  EXPECT_EQ(join_path("dir/", "x"), "dir/x");
  EXPECT_EQ(join_path("/", "x"), "/x");
  EXPECT_EQ(join_path("", "x"), "x");
  EXPECT_EQ(join_path(".", "x"), "./x");
}

TEST(PathTest, SiblingKeepsTheDirectoryAsSpelled) {
  EXPECT_EQ(sibling_path("ckpt/model.safetensors.index.json", "model-00001-of-00002.safetensors"),
            "ckpt/model-00001-of-00002.safetensors");
  EXPECT_EQ(sibling_path("/model.json", "s"), "/s");
  // No directory: the bare name, which is the same file as dirname_of(path) + "/s".
  EXPECT_EQ(sibling_path("model.json", "s"), "s");
  EXPECT_EQ(sibling_path("./model.json", "s"), "./s");
  EXPECT_EQ(sibling_path("a/b/", "s"), "a/b/s");
  // A relative name with directories stays relative to the path's directory.
  EXPECT_EQ(sibling_path("a/i.json", "sub/s"), "a/sub/s");
}

}  // namespace
}  // namespace safetensors::internal
