/* What the shim exports to the program: the hooked entry points. Everything else
 * is hidden (-fvisibility=hidden). */
#ifndef GPUCR_EXPORT_H
#define GPUCR_EXPORT_H

#define GPUCR_EXPORT __attribute__((visibility("default")))

#endif
