// What metal-cpp's Metal headers take from IOSurface.
#pragma once
typedef struct __IOSurface* IOSurfaceRef;
