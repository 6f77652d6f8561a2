// Package membership finds a job's workers by gossip, over
// hashicorp/memberlist, with no rendezvous server: a node starts from one
// or more seed addresses (any live member serves), and every node learns
// every other node's metadata: its data-plane address, job, role (worker
// or observer), epoch, rank and device. Gossip is encrypted with the key
// the cluster secret derives (secret.GossipKey), so a node with another
// secret cannot join.
//
// memberlist's own defaults bind 0.0.0.0 and advertise the machine's
// private address. This package never relies on them: Config.Listen is
// bound exactly, and the advertised address is Config.Advertise or, by
// default, Listen's host.
//
// Each member has a State. Members lists the live ones (alive or
// suspect), which is what views are built from; All also lists the dead
// (failed) and left (Node.Leave) members this node still remembers, for
// at most Config.Forget and MaxGone of them. memberlist's callbacks do not
// say whether a member died or left, so Node.Leave also gossips a leave
// notice; a member with none is dead.
//
// Views, epochs and the boundary protocol that admits joiners are built on
// top of this package in package gyre; membership only reports who is
// there.
package membership
