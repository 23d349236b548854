"The model and its training maths: settings, layers, losses, optimisers, schedules, precision, averaging."
