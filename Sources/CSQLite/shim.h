#ifndef UBIQUITYFS_CSQLITE_SHIM_H
#define UBIQUITYFS_CSQLITE_SHIM_H
#include <sqlite3.h>
#endif
