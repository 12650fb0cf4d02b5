// What runtime/gpu/cuda_driver.h finds in this process's environment, one line:
// "device <ordinal> <name> <arch> sms=<n> driver=<version>" per device asked for
// (ordinals from argv, default 0), or the Diag's message. Exit 0 when every
// device was found. cuda_runtime_test.cpp runs it with FAKE_CUDA_DEVICES and
// SHARDFUSE_LIBCUDA set for the child only.
#include <cstdio>
#include <cstdlib>

#include "runtime/gpu/cuda_driver.h"

int main(int argc, char** argv) {
  sf::Result<const sf::cuda::Driver*> d = sf::cuda::driver();
  if (!d) {
    std::printf("%s\n", d.error().message.c_str());
    return 1;
  }
  int rc = 0;
  for (int i = argc > 1 ? 1 : 0; i < (argc > 1 ? argc : 1); ++i) {
    const int ordinal = argc > 1 ? std::atoi(argv[i]) : 0;
    sf::Result<sf::cuda::DeviceInfo> info = sf::cuda::device_info(ordinal);
    if (!info) {
      std::printf("%s\n", info.error().message.c_str());
      rc = 1;
      continue;
    }
    std::printf("device %d %s %s sms=%d driver=%d\n", info->ordinal, info->name.c_str(), info->arch().c_str(),
                info->sms, info->driver_version);
  }
  return rc;
}
