#include "bench/replay/trace_reader.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace strata::replay {
namespace {

TEST(TraceReader, ParsesMooncakeLines) {
  auto r = ParseTraceLine(
      R"({"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 13]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->hash_ids, (std::vector<uint64_t>{0, 1, 2, 13}));
}

TEST(TraceReader, SkipsOtherFieldsOfAnyShape) {
  auto r = ParseTraceLine(
      " { \"meta\" : {\"a\": [1, -2.5e3, \"x\\\"y\\u00e9\"], \"b\": null}, \"ok\": true,"
      "\"hash_ids\":[ ],\"tail\": false } ");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->hash_ids.empty());
  r = ParseTraceLine(R"({"hash_ids": [18446744073709551615]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->hash_ids[0], UINT64_MAX);
}

TEST(TraceReader, RejectsMalformedLines) {
  for (const char* bad : {
           "", "[1, 2]",
           R"({"timestamp": 0})",                      // no hash_ids
           R"({"hash_ids": [1, -2]})",                 // negative id
           R"({"hash_ids": [1.5]})",                   // not an integer
           R"({"hash_ids": [18446744073709551616]})",  // overflows 64 bits
           R"({"hash_ids": [01]})",                    // leading zero
           R"({"hash_ids": [1, 2})",                   // unterminated array
           R"({"hash_ids": [1], "hash_ids": [2]})",    // duplicate key
           R"({"hash_ids": [1]} x)",                   // trailing garbage
           R"({"hash_ids": [1], "x": tru})",           // bad literal
           R"({"hash_ids": [1], "x": "abc})",          // unterminated string
       }) {
    EXPECT_FALSE(ParseTraceLine(bad).ok()) << bad;
  }
}

TEST(TraceReader, ReadsFilesWithLimitAndNamesBadLines) {
  const std::string path =
      ::testing::TempDir() + "/trace_reader_test_" + std::to_string(::getpid()) + ".jsonl";
  {
    std::ofstream out(path);
    out << R"({"hash_ids": [0, 1]})"
        << "\n\n"
        << R"({"hash_ids": [0, 2, 3]})"
        << "\r\n"
        << R"({"hash_ids": [4]})"
        << "\n";
  }
  auto all = ReadTrace(path);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[1].hash_ids, (std::vector<uint64_t>{0, 2, 3}));
  auto two = ReadTrace(path, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size(), 2u);
  {
    std::ofstream out(path, std::ios::app);
    out << R"({"hash_ids": [5,]})"
        << "\n";
  }
  auto bad = ReadTrace(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find(":5:"), std::string::npos) << bad.status();
  std::remove(path.c_str());
  EXPECT_EQ(ReadTrace(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace strata::replay
