#ifndef C_AVAHI_CLIENT_SHIM_H
#define C_AVAHI_CLIENT_SHIM_H

#include <avahi-client/client.h>
#include <avahi-client/publish.h>
#include <avahi-client/lookup.h>
#include <avahi-common/watch.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/alternative.h>
#include <avahi-common/strlst.h>
#include <avahi-common/address.h>
#include <avahi-common/defs.h>

#endif
