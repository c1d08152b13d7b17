"""`inferwatch doctor`: one pass of the node daemon's own collectors and checks, printed for a person.

``checks`` reads the host (CPU, SIMD, memory, GPU, runtime binary); ``engine`` reads one engine's endpoints.
"""
