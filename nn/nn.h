// The nn module: layers, losses, initialisers and models.
#pragma once

#include "attention.h"
#include "functional.h"
#include "gpt.h"
#include "init.h"
#include "layers.h"
#include "loss.h"
#include "module.h"
#include "resnet.h"
