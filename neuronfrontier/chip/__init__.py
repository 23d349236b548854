"""The chip's SDK: whether the real nki and TorchNeuron are here, their CPU stand-ins, kernel checks against torch."""
