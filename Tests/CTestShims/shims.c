#include "CTestShims.h"
#include <sys/syscall.h>
#include <unistd.h>

int ctestshims_pidfd_open(int pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }
