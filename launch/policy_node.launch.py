"""ROS 2 launch file: serve a robo-rl checkpoint on a robot (needs a ROS 2 install and robo-rl in the
same Python environment).

    ros2 launch launch/policy_node.launch.py checkpoint:=runs/<run> robot:=configs/robots/panda_sim.yaml

It only wires arguments to `robo-rl deploy` (transport rclpy when ROS 2's Python is importable);
topics, rates and safety limits come from the robot config.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import LaunchConfiguration


def generate_launch_description() -> LaunchDescription:
    checkpoint = LaunchConfiguration("checkpoint")
    robot = LaunchConfiguration("robot")
    transport = LaunchConfiguration("transport")
    return LaunchDescription([
        DeclareLaunchArgument("checkpoint", description="robo-rl run directory or checkpoints/step_* directory"),
        DeclareLaunchArgument("robot", default_value="configs/robots/panda_sim.yaml", description="robot config"),
        DeclareLaunchArgument("transport", default_value="auto", description="auto | rclpy | cyclonedds"),
        ExecuteProcess(cmd=["robo-rl", "deploy", checkpoint, "--robot", robot, "--transport", transport],
                       output="screen", sigterm_timeout="5"),
    ])
