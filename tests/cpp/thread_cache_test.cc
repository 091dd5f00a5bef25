// src/util/thread_cache.h: one value per thread, kept between calls, destroyed when its thread exits.
#include "util/thread_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <thread>

namespace safetensors::internal {
namespace {

std::atomic<int> destroyed{0};

struct Counted {
  int uses = 0;
  ~Counted() { destroyed.fetch_add(1); }
};

ThreadCache<Counted>& cache() {
  static ThreadCache<Counted> instance;
  return instance;
}

TEST(ThreadCacheTest, AThreadGetsTheSameValueOnEveryCall) {
  Counted& first = cache().get();
  first.uses += 1;
  Counted& second = cache().get();
  EXPECT_EQ(&first, &second);
  EXPECT_EQ(second.uses, first.uses);
}

TEST(ThreadCacheTest, EachThreadHasItsOwnValueDestroyedWhenItExits) {
  Counted* mine = &cache().get();
  const int before = destroyed.load();
  Counted* theirs[2] = {nullptr, nullptr};
  // Both threads hold their values at once (else the second could be given the first's freed memory).
  std::latch both(2);
  const auto run = [&](int i) {
    theirs[i] = &cache().get();
    EXPECT_EQ(theirs[i]->uses, 0);
    theirs[i]->uses = i + 1;
    EXPECT_EQ(&cache().get(), theirs[i]);
    both.arrive_and_wait();
  };
  std::thread a(run, 0);
  std::thread b(run, 1);
  a.join();
  b.join();
  EXPECT_NE(theirs[0], mine);
  EXPECT_NE(theirs[1], mine);
  EXPECT_NE(theirs[0], theirs[1]);
  // Both threads' values were destroyed at their exit (join returns after the key destructors ran); this
  // thread's is still here.
  EXPECT_EQ(destroyed.load(), before + 2);
  EXPECT_EQ(&cache().get(), mine);
}

TEST(ThreadCacheTest, AThreadThatNeverAsksCreatesNothing) {
  cache().get();
  const int before = destroyed.load();
  std::thread([] {}).join();
  EXPECT_EQ(destroyed.load(), before);
}

}  // namespace
}  // namespace safetensors::internal
