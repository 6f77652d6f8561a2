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
// Views, epochs and the boundary protocol that admits joiners are built on
// top of this package in package gyre; membership only reports who is
// there.
package membership
