"""Complete models assembled from ``sb_kda.nnet`` blocks."""
