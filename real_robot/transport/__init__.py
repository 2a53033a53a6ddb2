"""Transports for the ROS 2 bridge: ``rclpy`` (a real ROS 2 install), ``cyclonedds`` (pure pip,
wire-compatible with ROS 2) and ``inprocess`` (unit tests). ``make_transport("auto")`` picks rclpy
when it imports, else cyclonedds."""

from __future__ import annotations

from real_robot.transport.base import QoS, Subscription, Transport, make_transport

__all__ = ["QoS", "Subscription", "Transport", "make_transport"]
