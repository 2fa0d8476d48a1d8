// hardware::modelled_clock_options on the presets, against the numbers of
// hardware/hardware.cc worked by hand (one direction, per device):
//  * tpu-v5p: torus -> a ring at one ICI link's rate, 1200 GB/s / 12 = 100 GB/s;
//  * h100: NVSwitch at 900 / 2 = 450 GB/s up to its scale-up domain of 8;
//    beyond it (R = 9, 16) two_level, groups of 8, 400 Gbit/s = 50 GB/s out;
//  * the device rates: bf16 peak and HBM bandwidth; compute modelled, the
//    wall-clock link emulation off.
#include "hardware/modelled_clock_options.h"

#include <gtest/gtest.h>

namespace epmoe::hardware {
namespace {

ModelledClockOptions options_of(const std::string& preset, int num_ranks) {
  return modelled_clock_options(load_hardware("hardware", preset), num_ranks);
}

TEST(ModelledClockOptions, TorusIsARingAtOneLinksRate) {
  for (int num_ranks : {1, 8, 64}) {
    const ModelledClockOptions options = options_of("tpu-v5p", num_ranks);
    EXPECT_EQ(options.links.topology, LinkTopology::ring) << num_ranks;
    EXPECT_DOUBLE_EQ(options.links.bandwidth_gb_per_s, 100.0) << num_ranks;
  }
}

TEST(ModelledClockOptions, SwitchedUpToTheScaleUpDomainThenTwoLevel) {
  for (int num_ranks : {2, 8}) {
    const ModelledClockOptions options = options_of("h100", num_ranks);
    EXPECT_EQ(options.links.topology, LinkTopology::switched) << num_ranks;
    EXPECT_DOUBLE_EQ(options.links.bandwidth_gb_per_s, 450.0) << num_ranks;
  }
  for (int num_ranks : {9, 16}) {
    const ModelledClockOptions options = options_of("h100", num_ranks);
    EXPECT_EQ(options.links.topology, LinkTopology::two_level) << num_ranks;
    EXPECT_DOUBLE_EQ(options.links.bandwidth_gb_per_s, 450.0) << num_ranks;
    EXPECT_EQ(options.links.group_size, 8) << num_ranks;
    EXPECT_DOUBLE_EQ(options.links.scale_out_bandwidth_gb_per_s, 50.0) << num_ranks;
  }
}

TEST(ModelledClockOptions, DeviceRatesAndModelledComputeWithoutWallEmulation) {
  for (const std::string& preset : hardware_preset_names()) {
    const HardwareSpec device = load_hardware("hardware", preset);
    const ModelledClockOptions options = modelled_clock_options(device, 16);
    EXPECT_TRUE(options.time.enabled) << preset;
    EXPECT_FALSE(options.time.measured_compute) << preset;
    EXPECT_EQ(options.time.peak_flops, device.peak_bf16_flops) << preset;
    EXPECT_EQ(options.time.memory_bytes_per_s, device.memory_bytes_per_s) << preset;
    EXPECT_FALSE(options.links.enabled) << preset;
    EXPECT_NO_THROW(options.links.validate()) << preset;
    EXPECT_NO_THROW(options.time.validate()) << preset;
  }
}

}  // namespace
}  // namespace epmoe::hardware
