"""Child-process entry points: the only modules that import torch, transformers, peft or bitsandbytes."""
