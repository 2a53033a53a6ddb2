"""ROS 2 launch file: serve a robo-rl checkpoint on a robot (needs a ROS 2 install and robo-rl in the
same Python environment).

    ros2 launch launch/policy_node.launch.py checkpoint:=runs/<run> robot:=configs/robots/panda_sim.yaml

It only wires arguments to `robo-rl deploy`; topics, rates, safety limits and the transport come from
the robot config (``transport:=rclpy`` or ``cyclonedds`` overrides the config's transport).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction
from launch.substitutions import LaunchConfiguration


def _deploy(context, *_args, **_kwargs) -> list[ExecuteProcess]:
    cmd = ["robo-rl", "deploy", LaunchConfiguration("checkpoint").perform(context),
           "--robot", LaunchConfiguration("robot").perform(context)]
    transport = LaunchConfiguration("transport").perform(context)
    if transport:  # empty: the robot config's transport
        cmd += ["--transport", transport]
    return [ExecuteProcess(cmd=cmd, output="screen", sigterm_timeout="5")]


def generate_launch_description() -> LaunchDescription:
    return LaunchDescription([
        DeclareLaunchArgument("checkpoint", description="robo-rl run directory or checkpoints/step_* directory"),
        DeclareLaunchArgument("robot", default_value="configs/robots/panda_sim.yaml", description="robot config"),
        DeclareLaunchArgument("transport", default_value="",
                              description="empty (the robot config's) | auto | rclpy | cyclonedds"),
        OpaqueFunction(function=_deploy),
    ])
