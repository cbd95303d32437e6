// What metal-cpp's Foundation headers take from CoreFoundation.
#pragma once
typedef double CFTimeInterval;
typedef const void* CFTypeRef;
