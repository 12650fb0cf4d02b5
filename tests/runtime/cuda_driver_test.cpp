// The driver loader without a GPU (CI) and with one (the lent GPU machine).
#include "runtime/gpu/cuda_driver.h"

#include <gtest/gtest.h>

namespace sf {
namespace runtime_cuda_driver_test {

TEST(CudaDriver, EitherADeviceOrAReasonStartingNoCudaDevice) {
  Result<const cuda::Driver*> d = cuda::driver();
  if (!d) {
    EXPECT_EQ(d.error().message.rfind("no CUDA device: ", 0), 0u) << d.error().message;
    EXPECT_GT(d.error().message.size(), std::string("no CUDA device: ").size() + 10) << "it says why";
    Result<cuda::DeviceInfo> info = cuda::device_info(0);
    ASSERT_FALSE(info);
    EXPECT_EQ(info.error().message, d.error().message);
    GTEST_SKIP() << d.error().message;
  }
  Result<cuda::DeviceInfo> info = cuda::device_info(0);
  ASSERT_TRUE(info) << info.error().message;
  EXPECT_FALSE(info->name.empty());
  EXPECT_GE(info->cc_major, 7);
  EXPECT_GT(info->sms, 0);
  EXPECT_GE(info->driver_version, 12000);
  EXPECT_FALSE(cuda::device_info(1 << 20)) << "no such ordinal";
}

TEST(CudaDriver, ArchNamesFollowTheComputeCapability) {
  cuda::DeviceInfo i;
  i.cc_major = 9;
  i.cc_minor = 0;
  EXPECT_EQ(i.arch(), "sm_90a");  // Hopper's wgmma/TMA-era features need the 'a' target
  i.cc_major = 8;
  EXPECT_EQ(i.arch(), "sm_80");
  i.cc_minor = 6;
  EXPECT_EQ(i.arch(), "sm_86");
}

}  // namespace runtime_cuda_driver_test
}  // namespace sf
