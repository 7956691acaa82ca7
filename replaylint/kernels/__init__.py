"""The bundled Helion ReplaySSM KDA decode kernel (``pip install replaylint[kernels]``)."""
