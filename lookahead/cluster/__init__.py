"""Scale out on Ray Serve: `lookahead serve --ray` runs the server's engine in N replicas behind one
OpenAI-compatible endpoint (cluster/launch.py). Ray is an optional extra; nothing here imports it at
module import time except launch/replica/ingress code paths that run under Ray."""

from lookahead.cluster.config import ClassReplicas, ClusterConfig, parse_class_replicas

__all__ = ["ClassReplicas", "ClusterConfig", "parse_class_replicas"]
