#pragma once
#include "../msim/metal.h"
#include "../msim/tensor_ops.h"
