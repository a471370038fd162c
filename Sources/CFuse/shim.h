#ifndef UBIQUITYFS_CFUSE_SHIM_H
#define UBIQUITYFS_CFUSE_SHIM_H
// System-library targets take no C settings, so the API version is chosen here.
// 3.12 or later makes fuse_session_loop_mt a real function Swift can call.
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>
#endif
