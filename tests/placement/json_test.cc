#include "placement/internal/json.h"

#include "gtest/gtest.h"
#include "placement/internal/etcd_client.h"
#include "placement/internal/node_record.h"

namespace strata::placement::internal {
namespace {

TEST(JsonTest, ParsesGatewayShapes) {
  auto j = Json::Parse(R"({"header":{"revision":"42"},"kvs":[{"key":"YQ==","lease":"7"}],)"
                       R"("count":"1","ok":true,"n":-3,"x":null,"s":"a\"\\\n\u00e9\ud83d\ude00"})");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->Get("header")->IntOr("revision"), 42);
  ASSERT_EQ(j->Get("kvs")->items().size(), 1u);
  EXPECT_EQ(j->Get("kvs")->items()[0].StringOr("key"), "YQ==");
  EXPECT_TRUE(j->Get("ok")->boolean());
  EXPECT_EQ(j->IntOr("n"), -3);
  EXPECT_EQ(j->Get("x")->type(), Json::Type::kNull);
  EXPECT_EQ(j->StringOr("s"), "a\"\\\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(j->IntOr("missing", 5), 5);
}

TEST(JsonTest, RejectsMalformed) {
  for (const char* bad :
       {"", "{", "{\"a\"}", "{\"a\":1,}", "[1 2]", "\"abc", "{\"a\":tru}", "{} x", "\"\\q\""}) {
    EXPECT_FALSE(Json::Parse(bad).ok()) << bad;
  }
}

TEST(JsonTest, QuoteRoundTrips) {
  std::string s = "q\"b\\n\n\t\x01 end";
  auto j = Json::Parse(JsonQuote(s));
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->text(), s);
}

TEST(NodeRecordTest, RoundTripAndErrors) {
  NodeRecord r{"n\"1", "10.0.0.1:7000", 18'446'744'073'709'551'615ULL, 5, "0.1.0"};
  auto back = DecodeNodeRecord(EncodeNodeRecord(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, r);
  EXPECT_FALSE(DecodeNodeRecord("{\"address\":\"x\"}").ok());  // no id
  EXPECT_FALSE(DecodeNodeRecord("[]").ok());
}

TEST(EtcdClientTest, PrefixEnd) {
  EXPECT_EQ(PrefixEnd("/strata/nodes/"), "/strata/nodes0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixEnd(""), std::string(1, '\0'));
}

}  // namespace
}  // namespace strata::placement::internal
