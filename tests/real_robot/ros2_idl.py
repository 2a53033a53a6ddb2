"""Shared by the DDS peer tests: a loopback-only Cyclone DDS config, and the ROS 2 message types
declared by hand with plain cyclonedds IDL (no project code), as text to start peer scripts with."""

LOOPBACK = ('<CycloneDDS><Domain><General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces>'
            '<AllowMulticast>false</AllowMulticast></General><Discovery><Peers><Peer address="127.0.0.1"/></Peers>'
            '</Discovery></Domain></CycloneDDS>')

IDL_TYPES = r'''
import json, sys, threading, time
from dataclasses import dataclass
from cyclonedds.core import Listener, Policy, Qos
from cyclonedds.domain import DomainParticipant
from cyclonedds.idl import IdlStruct
from cyclonedds.idl import types as t
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

@dataclass
class Time(IdlStruct, typename="builtin_interfaces::msg::dds_::Time_"):
    sec: t.int32
    nanosec: t.uint32

@dataclass
class Header(IdlStruct, typename="std_msgs::msg::dds_::Header_"):
    stamp: Time
    frame_id: str

@dataclass
class JointState(IdlStruct, typename="sensor_msgs::msg::dds_::JointState_"):
    header: Header
    name: t.sequence[str]
    position: t.sequence[t.float64]
    velocity: t.sequence[t.float64]
    effort: t.sequence[t.float64]

@dataclass
class Image(IdlStruct, typename="sensor_msgs::msg::dds_::Image_"):
    header: Header
    height: t.uint32
    width: t.uint32
    encoding: str
    is_bigendian: t.uint8
    step: t.uint32
    data: t.sequence[t.byte]

@dataclass
class Bool(IdlStruct, typename="std_msgs::msg::dds_::Bool_"):
    data: bool

@dataclass
class MultiArrayDimension(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayDimension_"):
    label: str
    size: t.uint32
    stride: t.uint32

@dataclass
class MultiArrayLayout(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayLayout_"):
    dim: t.sequence[MultiArrayDimension]
    data_offset: t.uint32

@dataclass
class Float64MultiArray(IdlStruct, typename="std_msgs::msg::dds_::Float64MultiArray_"):
    layout: MultiArrayLayout
    data: t.sequence[t.float64]
'''
