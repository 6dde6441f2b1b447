// stratad's configuration parser (config/daemon_config.h ParseConfig): YAML over the defaults,
// then ValidateConfig. Whatever parses must validate again and name a catalog folder.
#include <cstdint>
#include <string_view>

#include "config/daemon_config.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto c = strata::ParseConfig(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!c.ok()) return 0;
  if (!strata::ValidateConfig(*c).ok()) strata::fuzz::Fail("a parsed config does not validate");
  (void)strata::NvmeCatalogDir(*c);
  return 0;
}
