// Quick start: publish one block of KV cache for a prompt, look the prompt up, fetch it back.
// Usage: strata_quickstart [HOST:PORT]   (default 127.0.0.1:7420)
#include <cstring>
#include <iostream>
#include <numeric>
#include <vector>

#include "strata/client.h"

int main(int argc, char** argv) {
  strata::ClientOptions options;
  if (argc > 1) options.endpoint = argv[1];
  auto client = strata::Client::Connect(options);
  if (!client.ok()) {
    std::cerr << "connect: " << client.status() << "\n";
    return 1;
  }

  // Everything that makes two blocks interchangeable: model, layout, parallelism, codec, tenant.
  strata::NamespaceSpec spec;
  spec.model_id = "meta-llama/Llama-3.1-8B";
  spec.model_revision = "main";
  spec.layout = {/*num_layers=*/32,       /*num_kv_heads=*/8,
                 /*head_dim=*/128,        strata::DType::kFloat16,
                 /*tokens_per_block=*/16, strata::KvKind::kSeparateKV};
  auto ns = (*client)->OpenNamespace(spec, "tenant-a");
  if (!ns.ok()) {
    std::cerr << "open namespace: " << ns.status() << "\n";
    return 1;
  }

  std::vector<uint32_t> prompt(20);  // 1 full block of 16 tokens + 4 that are not addressed
  std::iota(prompt.begin(), prompt.end(), 1000);
  std::vector<uint8_t> kv(spec.layout.BlockBytes());  // 2 MiB: the block's K and V, all layers
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<uint8_t>(i * 31);

  strata::ConstBuffer block{kv.data(), kv.size()};
  auto published = (*client)->Publish(*ns, prompt, {&block, 1});
  if (!published.ok()) {
    std::cerr << "publish: " << published.status() << "\n";
    return 1;
  }
  std::cout << "published " << published->stored << " block(s), deduplicated "
            << published->deduplicated << "\n";

  auto found = (*client)->Lookup(*ns, prompt);
  if (!found.ok()) {
    std::cerr << "lookup: " << found.status() << "\n";
    return 1;
  }
  std::cout << "cached prefix: " << found->prefix_tokens << " tokens\n";

  std::vector<uint8_t> out(kv.size());
  strata::MutableBuffer dst{out.data(), out.size()};
  auto fetched =
      (*client)->Fetch(*ns, std::span(found->ids).first(found->prefix_blocks), {&dst, 1});
  if (!fetched.ok()) {
    std::cerr << "fetch: " << fetched.status() << "\n";
    return 1;
  }
  bool same = fetched->fetched == 1 && out == kv;
  std::cout << "fetched " << fetched->fetched << " block(s), bytes "
            << (same ? "identical" : "DIFFERENT") << "\n";
  return same ? 0 : 1;
}
