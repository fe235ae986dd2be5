#include "CBenchSupport.h"
#include <stdlib.h>
#if defined(__linux__) && defined(__GLIBC__)
#include <malloc.h>
size_t bench_heap_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
}
size_t bench_heap_free(void) { return mallinfo2().fordblks; }
#else
size_t bench_heap_in_use(void) { return 0; }
size_t bench_heap_free(void) { return 0; }
#endif
