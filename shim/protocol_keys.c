/* The one spelling of every key (protocol_keys.h). */
#include "protocol_keys.h"

#define GPUCR_KEY_DEFINE(name) const char KEY_##name[] = #name;
GPUCR_KEYS(GPUCR_KEY_DEFINE)
