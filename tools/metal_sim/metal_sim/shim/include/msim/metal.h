// Everything <metal_stdlib> provides in the simulator.
#pragma once

#include "kernel.h"
#include "math.h"
#include "private_builtins.h"
#include "simdgroup_matrix.h"
#include "sync.h"
#include "types.h"
