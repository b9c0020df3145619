"""compass.io/v1alpha1: each kind's spec and status, its conditions, and the CRDs generated from them."""
