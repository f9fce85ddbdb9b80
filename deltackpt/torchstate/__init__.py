"""torch state <-> the repository's leaves and blobs.

``flatten`` turns a state (a module's ``state_dict``, an optimizer's, any nested dict, list or
tuple of tensors and plain values) into a tree plus tensor leaves; ``planner`` cuts the leaves'
bytes into blobs (``tensor_bytes``: a tensor's raw bytes without a copy, ``dtypes``: names on
disk); ``materialize`` reads blobs back into tensors, or straight into live ones; ``diff``
compares two versions tensor by tensor.

What it may import: torch, numpy, and the torch-free core (``repo``, ``format``, ``codecs``,
``store``, ``errors``).  Nothing here knows of background saves, the public API, training loops
or other frameworks: those packages build on this one.
"""
