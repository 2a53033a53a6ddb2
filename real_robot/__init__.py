"""ROS 2 bridge: messages (CDR through rosbags), transports, safety filter, policy node."""
