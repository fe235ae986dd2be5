// Linux's epoll, which Swift's Glibc module does not export. Transport's LoopReadiness uses it:
// one epoll set per loop, watched by one Dispatch read source.
#include <sys/epoll.h>
