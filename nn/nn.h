// The nn module: layers, losses, initialisers and models.
#pragma once

#include "init.h"
#include "layers.h"
#include "loss.h"
#include "module.h"
#include "resnet.h"
