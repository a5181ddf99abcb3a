"""Mining: search trees and trajectories -> preference pairs, RFT and hindsight examples."""
