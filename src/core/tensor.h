// Tensor is public (<epmoe/tensor.h>); inside epmoe this header also brings
// the checks (core/error.h) that every user of a tensor's contents makes.
#pragma once

#include <epmoe/tensor.h>

#include "core/error.h"
