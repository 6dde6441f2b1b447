// The daemon's calibration store (daemon/calibrations/calibration_store.h): versions, limits,
// malformed artefacts, and what survives a restart.
#include "daemon/calibrations/calibration_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <stdlib.h>

#include "absl/strings/str_format.h"
#include "codec/calibration.h"
#include "codec/synthetic_kv.h"

namespace strata::daemon {
namespace {

KvLayout SmallLayout() { return KvLayout{2, 2, 16, DType::kFloat16, 16, KvKind::kSeparateKV}; }

// A serialized calibration of SmallLayout(), distinct per (seed, version).
std::string Artefact(uint32_t version, uint64_t seed = 1, double bits = 2.0) {
  const KvLayout layout = SmallLayout();
  codec::SyntheticKvParams p;
  p.seed = seed;
  std::vector<uint8_t> kv = codec::GenerateSyntheticKv(layout, 8, p);
  std::vector<std::span<const uint8_t>> blocks;
  for (size_t i = 0; i < 8; ++i)
    blocks.push_back(std::span<const uint8_t>(kv).subspan(i * layout.BlockBytes(),
                                                          layout.BlockBytes()));
  codec::CalibrateOptions o;
  o.bits_per_value = bits;
  o.version = version;
  auto c = codec::Calibrate(layout, blocks, o);
  EXPECT_TRUE(c.ok()) << c.status();
  std::vector<uint8_t> bytes = c->Serialize();
  return std::string(bytes.begin(), bytes.end());
}

NamespaceId Ns(uint8_t b) {
  NamespaceId ns;
  ns.bytes.fill(b);
  return ns;
}

class CalibrationStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = std::filesystem::temp_directory_path() / "strata-calibrations-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<CalibrationStore> Open(CalibrationStore::Limits limits = {}) {
    auto s = CalibrationStore::Open(dir_, limits);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string dir_;
};

TEST_F(CalibrationStoreTest, TheHighestVersionIsCurrentAndEveryVersionStays) {
  auto store = Open();
  const std::string v1 = Artefact(1), v2 = Artefact(2, 2);
  auto r1 = store->Put(Ns(1), v1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->version, 1u);
  EXPECT_EQ(r1->head_dim, 16u);
  auto r2 = store->Put(Ns(1), v2);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_NE(r1->id, r2->id);

  auto current = store->Get(Ns(1), 0);
  ASSERT_TRUE(current.ok());
  EXPECT_EQ(current->id, r2->id);
  auto old = store->Get(Ns(1), r1->id);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(*old->artefact, v1);
  // Another namespace sees none of them.
  EXPECT_TRUE(absl::IsNotFound(store->Get(Ns(2), 0).status()));
  EXPECT_TRUE(absl::IsNotFound(store->Get(Ns(2), r1->id).status()));

  // Storing the same bytes again is a no-op.
  auto again = store->Put(Ns(1), v1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id, r1->id);
  EXPECT_EQ(store->size(), 2u);
  auto listed = store->List(Ns(1));
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].version, 1u);
  EXPECT_EQ(listed[1].version, 2u);
}

TEST_F(CalibrationStoreTest, AVersionNamesOneCalibration) {
  auto store = Open();
  ASSERT_TRUE(store->Put(Ns(1), Artefact(1, 1)).ok());
  auto clash = store->Put(Ns(1), Artefact(1, 7));
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kFailedPrecondition) << clash.status();
  EXPECT_NE(clash.status().message().find("version 1"), std::string::npos) << clash.status();
  // In another namespace the same version is free.
  EXPECT_TRUE(store->Put(Ns(2), Artefact(1, 7)).ok());
}

TEST_F(CalibrationStoreTest, MalformedArtefactsAreRefused) {
  auto store = Open();
  std::string bytes = Artefact(1);
  EXPECT_EQ(store->Put(Ns(1), "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Put(Ns(1), "not a calibration").status().code(),
            absl::StatusCode::kInvalidArgument);
  bytes[bytes.size() / 2] ^= 0x40;  // the CRC trailer no longer matches
  EXPECT_EQ(store->Put(Ns(1), bytes).status().code(), absl::StatusCode::kInvalidArgument);
  bytes = Artefact(1);
  bytes.resize(bytes.size() - 1);
  EXPECT_EQ(store->Put(Ns(1), bytes).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->size(), 0u);
}

TEST_F(CalibrationStoreTest, LimitsRefuseNewCalibrationsAndDropNone) {
  const uint64_t one = Artefact(1).size();
  auto store = Open({/*max_per_namespace=*/2, /*max_bytes=*/3 * one + one / 2});
  ASSERT_TRUE(store->Put(Ns(1), Artefact(1)).ok());
  ASSERT_TRUE(store->Put(Ns(1), Artefact(2)).ok());
  auto third = store->Put(Ns(1), Artefact(3));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  ASSERT_TRUE(store->Put(Ns(2), Artefact(1)).ok());
  auto over = store->Put(Ns(3), Artefact(1));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("calibration_bytes"), std::string::npos);
  EXPECT_EQ(store->size(), 3u);
  EXPECT_TRUE(store->Get(Ns(1), 0).ok());
}

TEST_F(CalibrationStoreTest, ARestartedStoreHasEveryCalibrationAndSetsDamagedFilesAside) {
  uint64_t id1, id2;
  {
    auto store = Open();
    id1 = store->Put(Ns(1), Artefact(1))->id;
    id2 = store->Put(Ns(1), Artefact(2, 2))->id;
    ASSERT_TRUE(store->Put(Ns(2), Artefact(5, 3)).ok());
  }
  // A damaged file (a torn write the rename should have prevented, or a bad disk) and a stray
  // file with a calibration under another id's name.
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 3u);
  const std::string ns2 = Ns(2).ToHex();
  for (const auto& f : files)
    if (f.filename().string().rfind(ns2, 0) == 0) {
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(100);
      io.put('\x5a');
    }
  std::ofstream(dir_ + "/" + Ns(3).ToHex() + "-0123456789abcdef.skvp", std::ios::binary)
      << Artefact(1, 9);

  auto store = Open();
  EXPECT_EQ(store->size(), 2u);
  EXPECT_EQ(store->rejected_files(), 2u);
  EXPECT_EQ(store->Get(Ns(1), 0)->id, id2);
  EXPECT_TRUE(store->Get(Ns(1), id1).ok());
  EXPECT_TRUE(absl::IsNotFound(store->Get(Ns(2), 0).status()));
  EXPECT_TRUE(absl::IsNotFound(store->Get(Ns(3), 0).status()));
  size_t bad = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    bad += e.path().extension() == ".bad";
  EXPECT_EQ(bad, 2u);

  // Two files of one version (a crash between a Put and the removal of the one refused): the
  // first in name order stays, the other is set aside, so a version still names one calibration.
  const std::string other = Artefact(2, 77);  // version 2 again, another id
  auto described = CalibrationStore::Open("", {});
  ASSERT_TRUE(described.ok());
  auto parsed = (*described)->Put(Ns(1), other);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  std::ofstream(dir_ + "/" + Ns(1).ToHex() + "-" + absl::StrFormat("%016x", parsed->id) + ".skvp",
                std::ios::binary)
      << other;
  store.reset();
  store = Open();
  EXPECT_EQ(store->size(), 2u);
  EXPECT_EQ(store->rejected_files(), 1u);
  ASSERT_EQ(store->List(Ns(1)).size(), 2u);
}

// Two Puts of one artefact at once (a client's and a peer's copy of it) both succeed, and the
// directory holds the one file.
TEST_F(CalibrationStoreTest, TwoPutsOfOneArtefactAtOnceBothSucceed) {
  auto store = Open();
  for (uint32_t round = 0; round < 12; ++round) {  // within max_per_namespace (16)
    const std::string a = Artefact(round + 1, 100 + round);
    absl::Status got[2];
    std::thread t([&] { got[0] = store->Put(Ns(4), a).status(); });
    got[1] = store->Put(Ns(4), a).status();
    t.join();
    EXPECT_TRUE(got[0].ok() && got[1].ok()) << round << ": " << got[0] << " / " << got[1];
  }
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().extension(), ".skvp") << e.path();
    ++files;
  }
  EXPECT_EQ(files, 12u);
  // Two artefacts of one version at once: one is stored, the other refused, and one file stays
  // (before, both could be written and a crash then left two files of the version).
  for (uint32_t round = 0; round < 3; ++round) {
    const std::string a = Artefact(100 + round, 300 + round), b = Artefact(100 + round, 400);
    absl::Status got[2];
    std::thread t([&] { got[0] = store->Put(Ns(5), a).status(); });
    got[1] = store->Put(Ns(5), b).status();
    t.join();
    EXPECT_EQ(got[0].ok() + got[1].ok(), 1) << got[0] << " / " << got[1];
    for (const absl::Status& g : got) {
      if (g.ok()) continue;
      EXPECT_EQ(g.code(), absl::StatusCode::kFailedPrecondition) << g;
    }
  }
  size_t of_five = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    of_five += e.path().filename().string().rfind(Ns(5).ToHex(), 0) == 0;
  EXPECT_EQ(of_five, 3u);
}

// The daemon's coders parse calibrations through the store's bounded cache: within its budget
// the least recently used calibration nobody holds goes (and is parsed again when asked), one
// in use stays, and a namespace never gets another's calibration through the shared cache.
TEST_F(CalibrationStoreTest, ParsedCalibrationsStayWithinTheirBudget) {
  const std::string v1 = Artefact(1), v2 = Artefact(2, 2), v3 = Artefact(3, 3);
  auto probe = codec::Calibration::Parse({reinterpret_cast<const uint8_t*>(v1.data()), v1.size()});
  ASSERT_TRUE(probe.ok());
  CalibrationStore::Limits limits;
  limits.parsed_bytes = 2 * probe->MemoryBytes() + probe->MemoryBytes() / 2;  // two fit
  auto store = Open(limits);
  uint64_t id[3];
  int i = 0;
  for (const std::string* a : {&v1, &v2, &v3}) {
    auto r = store->Put(Ns(1), *a);
    ASSERT_TRUE(r.ok()) << r.status();
    id[i++] = r->id;
  }
  for (int round = 0; round < 3; ++round)
    for (uint64_t want : id) {
      auto c = store->Parsed(Ns(1), want);
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ((*c)->Id(), want);
      EXPECT_EQ(store->parsed().Find(want), *c);  // what the daemon's coders look up
      EXPECT_LE(store->parsed().bytes(), limits.parsed_bytes);
    }
  EXPECT_EQ(store->parsed().Ids().size(), 2u);
  EXPECT_EQ(store->parsed().evictions(), 7u);  // every parse after the first two

  // Held calibrations stay, over the budget if they must, until released.
  {
    auto a = store->Parsed(Ns(1), id[0]);
    auto b = store->Parsed(Ns(1), id[1]);
    auto c = store->Parsed(Ns(1), id[2]);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(store->parsed().Ids().size(), 3u);
    EXPECT_GT(store->parsed().bytes(), limits.parsed_bytes);
  }
  // Released, they go with the next one parsed.
  auto r4 = store->Put(Ns(1), Artefact(4, 4));
  ASSERT_TRUE(r4.ok()) << r4.status();
  auto fourth = store->Parsed(Ns(1), r4->id);
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_LE(store->parsed().bytes(), limits.parsed_bytes);
  EXPECT_EQ(store->parsed().Ids().size(), 2u);

  // Another namespace's id is not this namespace's, cached or not.
  auto other = store->Parsed(Ns(2), id[2]);
  EXPECT_TRUE(absl::IsNotFound(other.status())) << other.status();
}

TEST_F(CalibrationStoreTest, WithoutADirectoryNothingIsWritten) {
  auto store = CalibrationStore::Open("", {});
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Put(Ns(1), Artefact(1)).ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

}  // namespace
}  // namespace strata::daemon
