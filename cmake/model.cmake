# model area: xtensor (header-only) for reading .npy token files in `olmosft forward` (src/cli/forward.cpp).
find_package(xtensor REQUIRED)
target_link_libraries(olmosft_lib PUBLIC xtensor)
