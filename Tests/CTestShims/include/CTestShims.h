#ifndef CTESTSHIMS_H
#define CTESTSHIMS_H

/// pidfd_open(2): a file descriptor that becomes readable when the process exits (Linux 5.3). Swift
/// cannot call the variadic syscall(2) itself. -1 with errno set on failure.
int ctestshims_pidfd_open(int pid);

#endif
