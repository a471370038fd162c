#ifndef UBIQUITYFS_CPOSTGRES_SHIM_H
#define UBIQUITYFS_CPOSTGRES_SHIM_H
#include <libpq-fe.h>
#endif
