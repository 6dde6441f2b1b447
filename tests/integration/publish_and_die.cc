// Test helper: a client that reserves space, writes block bytes over UCX, then is killed
// (SIGKILL) before Commit. Usage: publish_and_die ENDPOINT BLOCKS BYTES
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "strata/block_id.h"
#include "strata/v1/cache.grpc.pb.h"
#include "transport/ucx.h"

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const int blocks = atoi(argv[2]);
  const size_t bytes = strtoull(argv[3], nullptr, 10);
  auto stub =
      strata::v1::Cache::NewStub(grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials()));
  auto call = [](grpc::ClientContext& c) {
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  };
  strata::v1::ConnectResponse conn;
  {
    grpc::ClientContext c;
    call(c);
    if (!stub->Connect(&c, {}, &conn).ok()) return 3;
  }
  strata::v1::OpenNamespaceRequest open;
  open.set_tenant("victim");
  open.mutable_spec()->set_model_id("m");
  open.mutable_spec()->set_tp_size(1);
  open.mutable_spec()->set_codec_policy("raw");
  auto* l = open.mutable_spec()->mutable_layout();
  l->set_num_layers(1);
  l->set_num_kv_heads(1);
  l->set_head_dim(64);
  l->set_dtype(1);
  l->set_tokens_per_block(16);
  l->set_kind(1);
  strata::v1::OpenNamespaceResponse ns;
  {
    grpc::ClientContext c;
    call(c);
    if (!stub->OpenNamespace(&c, open, &ns).ok()) return 4;
  }
  strata::v1::ReserveRequest req;
  req.set_namespace_id(ns.namespace_id());
  std::string ids;
  for (int i = 0; i < blocks; ++i) {
    auto id = strata::ComputeBlockId(strata::Digest{}, std::vector<uint32_t>{uint32_t(i), 77});
    ids.append(id.AsBytes());
    req.add_sizes(bytes);
  }
  req.set_ids(ids);
  strata::v1::ReserveResponse res;
  {
    grpc::ClientContext c;
    call(c);
    if (!stub->Reserve(&c, req, &res).ok()) return 5;
  }
  auto ctx = strata::transport::Context::Create(false);
  auto worker = strata::transport::Worker::Create(*ctx);
  auto ep = (*worker)->Connect(conn.worker_address());
  if (!ep.ok() || !(*ep)->SetRemoteKey(conn.arena_rkey()).ok()) return 6;
  std::vector<char> data(bytes, 'x');
  std::vector<strata::transport::RmaOp> ops;
  for (int i = 0; i < res.offsets_size(); ++i)
    if (res.status(i) == strata::v1::BLOCK_OK)
      ops.push_back(
          {strata::transport::RmaOp::kPut, data.data(), bytes, conn.arena_base() + res.offsets(i)});
  if (!(*ep)->Transfer(ops, absl::Now() + absl::Seconds(5)).ok()) return 7;
  std::printf("reserved %d blocks, bytes written, dying before commit\n", res.offsets_size());
  std::fflush(stdout);
  raise(SIGKILL);
  return 0;
}
