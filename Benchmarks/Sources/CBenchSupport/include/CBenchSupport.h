#ifndef CBENCHSUPPORT_H
#define CBENCHSUPPORT_H
#include <stddef.h>

/// Bytes of heap in use (glibc mallinfo2: uordblks + hblkhd, all arenas); 0 elsewhere.
size_t bench_heap_in_use(void);

/// Bytes malloc holds free inside its arenas (glibc mallinfo2: fordblks); 0 elsewhere.
size_t bench_heap_free(void);

#endif
