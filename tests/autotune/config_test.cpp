// Config text and JSON forms, and tuning keys. No compiler, no GPU: every number an
// assertion compares against is computed by hand in the comment beside it.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "autotune/config.h"
#include "autotune/problem.h"
#include "autotune/space.h"
#include "autotune/target.h"
#include "tests/autotune/autotune_test_util.h"

namespace sf {
namespace autotune_config_test {

using namespace autotune_test;

// ---------------------------------------------------------------------------------
// Config text and JSON

TEST(ConfigTest, TextAndJsonRoundTripEveryKindAndTarget) {
  for (const TargetInfo& t : {gpu("sm_90"), host()})
    for (KernelKind k : kKinds) {
      SCOPED_TRACE(t.name + " " + std::string(kernel_kind_name(k)));
      std::vector<KernelConfig> space = config_space(problem_of(k), t);
      ASSERT_FALSE(space.empty());
      for (const KernelConfig& c : space) {
        std::string text = config_str(k, t.kind, c);
        Result<KernelConfig> back = parse_config_str(text);
        ASSERT_TRUE(back.ok()) << text << ": " << back.error().message;
        // Spaces only set the fields that matter, so the round trip is exact.
        EXPECT_EQ(*back, c) << text;
        EXPECT_EQ(config_str(k, t.kind, *back), text);

        nlohmann::json j = config_to_json(k, t.kind, c);
        Result<KernelConfig> from_json = config_from_json(j);
        ASSERT_TRUE(from_json.ok()) << j.dump() << ": " << from_json.error().message;
        EXPECT_EQ(*from_json, c) << j.dump();
        EXPECT_EQ(j.size(), static_cast<size_t>(std::count(text.begin(), text.end(), '=')));
      }
    }
}

TEST(ConfigTest, TextNamesTheFieldsOfItsKind) {
  KernelConfig c;
  EXPECT_EQ(config_str(KernelKind::Pointwise, ConfigTarget::Gpu, c),
            "block=256 vector=4 elems_per_thread=1 grid_stride=1 max_blocks=4096");
  EXPECT_EQ(config_str(KernelKind::Reduction, ConfigTarget::Gpu, c),
            "rows_per_block=1 threads_per_row=256 split_reduction=1 grid_stride=1 max_blocks=4096");
  EXPECT_EQ(config_str(KernelKind::Matmul, ConfigTarget::Gpu, c),
            "block_m=64 block_n=64 block_k=16 warps=4 stages=2 group_m=8 split_k=1");
  EXPECT_EQ(config_str(KernelKind::Gather, ConfigTarget::Gpu, c), "block=256 max_blocks=4096");
  EXPECT_EQ(config_str(KernelKind::Matmul, ConfigTarget::Host, c), "host_tile_n=0 host_vector=0 host_interleave=0");
  EXPECT_EQ(config_str(KernelKind::Pointwise, ConfigTarget::Host, c), "host_vector=0 host_interleave=0");
  EXPECT_EQ(config_to_json(KernelKind::Pointwise, ConfigTarget::Gpu, c)["grid_stride"], true);
  // Knobs added after caches and Plans were written appear only away from their
  // default, so those texts stay what they were: an attention's wgmma and group_heads.
  EXPECT_EQ(config_str(KernelKind::Attention, ConfigTarget::Gpu, c), "block_m=64 block_n=64 warps=4");
  c.wgmma = 1;
  c.group_heads = 3;
  EXPECT_EQ(config_str(KernelKind::Attention, ConfigTarget::Gpu, c), "block_m=64 block_n=64 warps=4 wgmma=1 group_heads=3");
  c.stages = 3;  // an attention's stages appear away from 2; a matmul's always do
  EXPECT_EQ(config_str(KernelKind::Attention, ConfigTarget::Gpu, c),
            "block_m=64 block_n=64 warps=4 stages=3 wgmma=1 group_heads=3");
  c.warp_specialize = 1;
  c.pingpong = 1;
  EXPECT_EQ(config_str(KernelKind::Attention, ConfigTarget::Gpu, c),
            "block_m=64 block_n=64 warps=4 stages=3 wgmma=1 warp_specialize=1 pingpong=1 group_heads=3");
  EXPECT_NE(config_str(KernelKind::Matmul, ConfigTarget::Gpu, KernelConfig{}).find(" stages=2 "), std::string::npos);
  Result<KernelConfig> back = parse_config_str("block_m=256 block_n=64 warps=16 wgmma=1 group_heads=3");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->group_heads, 3);
  EXPECT_EQ(config_to_json(KernelKind::Attention, ConfigTarget::Gpu, c)["group_heads"], 3);
  EXPECT_EQ(config_str(KernelKind::Attention, ConfigTarget::Host, c), "block_m=64 block_n=64") << "the host runs blocks in turn";
}

TEST(ConfigTest, ParseReadsOverBase) {
  KernelConfig base;
  base.block_m = 128;
  Result<KernelConfig> c = parse_config_str("  block=512   grid_stride=0 ", base);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->block, 512);
  EXPECT_FALSE(c->grid_stride);
  EXPECT_EQ(c->block_m, 128) << "fields not in the text keep the base's value";
  Result<KernelConfig> empty = parse_config_str("", base);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, base);
}

TEST(ConfigTest, ErrorsNameTheOffendingToken) {
  struct Case {
    const char* text;
    const char* named;
  };
  const Case text_cases[] = {
      {"block=256 vectr=4", "'vectr'"},
      {"block=256 vector", "'vector'"},
      {"block=abc", "'block=abc'"},
      {"block=12x", "'block=12x'"},
      {"block=", "'block='"},
      {"block=99999999999", "'block=99999999999'"},
      {"grid_stride=2", "'grid_stride=2'"},
      {"=4", "''"},
  };
  for (const Case& c : text_cases) {
    SCOPED_TRACE(c.text);
    Result<KernelConfig> r = parse_config_str(c.text);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find(c.named), std::string::npos) << r.error().message;
  }
  struct JsonCase {
    nlohmann::json j;
    const char* named;
  };
  const JsonCase json_cases[] = {
      {{{"block", 256}, {"blok", 1}}, "'blok'"},
      {{{"block", "256"}}, "'block'"},
      {{{"block", 1.5}}, "'block'"},
      {{{"block", int64_t{1} << 40}}, "'block'"},
      {{{"grid_stride", 2}}, "'grid_stride'"},
      {{{"grid_stride", "yes"}}, "'grid_stride'"},
      {nlohmann::json::array({1, 2}), "[1,2]"},
  };
  for (const JsonCase& c : json_cases) {
    SCOPED_TRACE(c.j.dump());
    Result<KernelConfig> r = config_from_json(c.j);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find(c.named), std::string::npos) << r.error().message;
  }
  // Booleans as 0/1 integers are accepted, as the text form writes them.
  Result<KernelConfig> r = config_from_json({{"grid_stride", 0}});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->grid_stride);
}

TEST(ConfigTest, KindNames) {
  for (KernelKind k : kKinds) EXPECT_EQ(parse_kernel_kind(kernel_kind_name(k)), k);
  EXPECT_EQ(parse_kernel_kind("conv"), std::nullopt);
}

// ---------------------------------------------------------------------------------
// Tuning keys

TEST(TuneKeyTest, Fnv1aKnownValues) {
  // The FNV-1a 64-bit offset basis and the published test vector for "a".
  EXPECT_EQ(fnv1a_hex(""), "cbf29ce484222325");
  EXPECT_EQ(fnv1a_hex("a"), "af63dc4c8601ec8c");
  EXPECT_EQ(fnv1a_hex("foobar"), "85944171f73967e8");
  EXPECT_EQ(fnv1a_hex("a").size(), 16u);
}

TEST(TuneKeyTest, ShapesKey) {
  std::vector<std::vector<int64_t>> s = {{100, 127}, {127, 100}, {100, 100}};
  EXPECT_EQ(shapes_key(s, 2, ShapeBuckets::Exact), "100x127,127x100->100x100");
  EXPECT_EQ(shapes_key(s, 2, ShapeBuckets::Pow2), "128x128,128x128->128x128");
  EXPECT_EQ(shapes_key({{128, 129}}, 1, ShapeBuckets::Pow2), "128x256->");
  EXPECT_EQ(shapes_key({{}, {4}}, 1, ShapeBuckets::Exact), "scalar->4");
  EXPECT_EQ(shapes_key({{4}}, 0, ShapeBuckets::Exact), "->4");
  EXPECT_EQ(shapes_key({{1}, {1}}, 1, ShapeBuckets::Pow2), "1->1");
}

TEST(TuneKeyTest, Pow2BucketsShareAKeyExactDoesNot) {
  auto key = [](int64_t n, ShapeBuckets b) {
    TuneProblem p = pointwise(n);
    p.signature = "sig";
    return make_tune_key(p, b, "sm_90a", "llvm 19; ptxas 13");
  };
  EXPECT_EQ(key(100, ShapeBuckets::Pow2), key(127, ShapeBuckets::Pow2));
  EXPECT_EQ(key(100, ShapeBuckets::Pow2).shapes, "128->128");
  EXPECT_EQ(key(100, ShapeBuckets::Pow2).hash(), key(127, ShapeBuckets::Pow2).hash());
  EXPECT_NE(key(128, ShapeBuckets::Pow2), key(129, ShapeBuckets::Pow2));
  EXPECT_NE(key(100, ShapeBuckets::Exact), key(127, ShapeBuckets::Exact));
  EXPECT_NE(key(100, ShapeBuckets::Exact).hash(), key(127, ShapeBuckets::Exact).hash());
  EXPECT_EQ(key(100, ShapeBuckets::Exact).shapes, "100->100");
}

TEST(TuneKeyTest, HashChangesWithEveryField) {
  TuneProblem p = matmul(64, 128, 512);
  p.signature = "0123abcd";
  TuneKey base = make_tune_key(p, ShapeBuckets::Exact, "sm_90a", "llvm 19.1.7; ptxas 13.0.88");
  EXPECT_EQ(base.kind, "matmul");
  EXPECT_EQ(base.signature, "0123abcd");
  EXPECT_EQ(base.shapes, "64x512,512x128->64x128");
  EXPECT_EQ(base.text(),
            "kind: matmul\nsignature: 0123abcd\nshapes: 64x512,512x128->64x128\ntarget: sm_90a\n"
            "toolchain: llvm 19.1.7; ptxas 13.0.88\n");
  EXPECT_EQ(base.hash(), fnv1a_hex(base.text()));
  std::set<std::string> hashes = {base.hash()};
  std::vector<TuneKey> variants(5, base);
  variants[0].kind = "pointwise";
  variants[1].signature = "0123abce";
  variants[2].shapes = "64x512,512x128->64x129";
  variants[3].target = "sm_90";
  variants[4].toolchain = "llvm 19.1.7; ptxas 13.0.88; driver 13000";
  for (const TuneKey& v : variants) {
    EXPECT_NE(v, base);
    EXPECT_TRUE(hashes.insert(v.hash()).second) << v.text();
  }
}

}  // namespace autotune_config_test
}  // namespace sf
